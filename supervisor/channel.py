"""The laptop end of an agent channel: JSON-line requests with ids over any byte stream pair.

Shared by ``LocalHost`` (a subprocess's pipes) and ``SSHHost`` (an SSH channel). The reader
tolerates anything the remote side prints that is not a reply (login banners, MOTD, shell noise):
a line counts only when it is a JSON object whose ``id`` is a pending request (or 0, the agent's
hello). Replies are matched to requests by id, so requests may overlap. A line with a ``progress``
and no ``ok`` is an interim report of a request that asked for one: it goes to that request's
listener and the request keeps waiting for its reply.

When the stream ends, every pending request fails: with ``OutcomeUnknown`` when the op acts on the
host (the action may or may not have happened; the caller must reconcile, never repeat blindly),
with ``HostError`` otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from supervisor.agent.masking import mask_json_text
from supervisor.errors import AgentError, HostError, OutcomeUnknown

ACTING_OPS = frozenset(
    ("kill", "unit_stop", "launch", "repair_tail", "move_aside", "write_fingerprint")
)
"""Ops whose effect on the host is unknown when their reply is lost."""


class LineReader(Protocol):
    """What the channel reads from: ``asyncio.StreamReader`` or an asyncssh ``SSHReader``."""

    def readline(self) -> Awaitable[bytes | str]: ...


class LineWriter(Protocol):
    """What the channel writes to: ``asyncio.StreamWriter`` or an asyncssh ``SSHWriter``."""

    def write(self, data: Any) -> Any: ...

    def drain(self) -> Awaitable[None]: ...


class AgentChannel:
    """Requests and replies over one agent connection.

    Args:
        reader: where the agent's stdout arrives.
        writer: the agent's stdin.
        name: the host's name, for error messages.
        diagnostics: returns extra text (e.g. the agent's stderr tail) for error messages.
    """

    def __init__(
        self,
        reader: LineReader,
        writer: LineWriter,
        *,
        name: str,
        diagnostics: Callable[[], str] | None = None,
    ) -> None:
        self.name = name
        self._reader = reader
        self._writer = writer
        self._diagnostics = diagnostics
        self._pending: dict[int, tuple[asyncio.Future[dict[str, Any]], str]] = {}
        self._listeners: dict[int, Callable[[dict[str, Any]], None]] = {}
        self._next_id = 1
        self._task: asyncio.Task[None] | None = None
        self._closed_reason: str | None = None
        self._read_error: str | None = None
        self.hello: dict[str, Any] | None = None
        self.noise: deque[str] = deque(maxlen=20)
        """The last lines that were not protocol (banners...), for diagnostics."""

    @property
    def connected(self) -> bool:
        return self.hello is not None and self._closed_reason is None

    def _diag(self) -> str:
        parts = []
        if self.noise:
            parts.append("output: " + " | ".join(list(self.noise)[-5:]))
        if self._diagnostics is not None:
            extra = self._diagnostics().strip()
            if extra:
                parts.append(extra)
        return "; ".join(parts)

    async def start(self, timeout: float) -> dict[str, Any]:
        """Wait for the agent's hello (skipping banners); then serve replies in the background."""
        try:
            hello = await asyncio.wait_for(self._read_hello(), timeout)
        except asyncio.TimeoutError:
            self._closed_reason = "no hello"
            raise HostError(
                f"{self.name}: the agent did not start within {timeout:g} s",
                self._diag() or "check the host's python (>= 3.8) and its login shell",
            ) from None
        self.hello = hello
        self._task = asyncio.get_running_loop().create_task(self._read_loop())
        return hello

    async def _read_hello(self) -> dict[str, Any]:
        while True:
            msg = await self._next_message()
            if msg is None:
                self._closed_reason = "closed before hello"
                if self._read_error is not None:
                    raise HostError(
                        f"{self.name}: connection lost before the agent was ready: "
                        f"{self._read_error}",
                        self._diag() or "check the host and retry",
                    )
                raise HostError(
                    f"{self.name}: the agent exited before it was ready",
                    self._diag() or "check the host's python (>= 3.8)",
                )
            result = msg.get("result")
            if (
                msg.get("id") == 0
                and msg.get("ok")
                and isinstance(result, dict)
                and result.get("hello") == "runwatch-agent"
            ):
                return result

    async def _next_message(self) -> dict[str, Any] | None:
        """The next protocol-looking JSON object, or None at end of stream."""
        while True:
            try:
                raw = await self._reader.readline()
            except (asyncio.IncompleteReadError, ConnectionError, OSError):
                return None
            except (ValueError, asyncio.LimitOverrunError) as e:  # a line over the reader's limit
                raise HostError(f"{self.name}: agent line too long: {e}") from None
            except Exception as e:
                # The transport's own errors (asyncssh's ConnectionLost, DisconnectError...) end
                # the stream like a closed pipe: pending requests fail as HostError or
                # OutcomeUnknown, never with the transport's exception.
                self._read_error = str(e).splitlines()[0] if str(e) else type(e).__name__
                return None
            if not raw:
                return None
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
            msg = _parse(text)
            if msg is None:
                stripped = text.strip()
                if stripped:
                    self.noise.append(stripped[:200])
                continue
            return msg

    async def _read_loop(self) -> None:
        reason = "the agent's output ended"
        try:
            while True:
                msg = await self._next_message()
                if msg is None:
                    reason = self._read_error or reason
                    break
                rid = msg.get("id")
                if not isinstance(rid, int) or rid not in self._pending:
                    continue  # not ours: a stale reply of a timed-out request, or noise
                if "ok" not in msg:
                    listener = self._listeners.get(rid)
                    progress = msg.get("progress")
                    if listener is not None and isinstance(progress, dict):
                        listener(progress)
                    continue  # an interim line: the reply is still to come
                self._listeners.pop(rid, None)
                fut, _op = self._pending.pop(rid)
                if not fut.done():
                    fut.set_result(msg)
        except HostError as e:
            reason = e.message
        except asyncio.CancelledError:
            reason = "the channel was closed"
            raise
        finally:
            self._fail_pending(reason)

    def _fail_pending(self, reason: str) -> None:
        if self._closed_reason is None:
            self._closed_reason = reason
        pending, self._pending = self._pending, {}
        self._listeners = {}
        diag = self._diag()
        for fut, op in pending.values():
            if fut.done():
                continue
            if op in ACTING_OPS:
                fut.set_exception(
                    OutcomeUnknown(
                        f"{self.name}: connection lost during {op}: {reason}; outcome unknown",
                        "re-list the host and reconcile; do not repeat the action blindly",
                    )
                )
            else:
                fut.set_exception(
                    HostError(f"{self.name}: connection lost during {op}: {reason}", diag or None)
                )

    async def request(
        self,
        op: str,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Send one request and wait for its reply's ``result``.

        ``on_progress`` gets the ``progress`` of every interim line of this request (the agent
        sends them when ``params`` asks for progress), on the event loop, before the reply.

        Raises AgentError (the agent answered with an error), OutcomeUnknown (an acting op whose
        reply was lost or late) or HostError (anything else: closed channel, timeout).
        """
        if self._closed_reason is not None or self.hello is None:
            raise HostError(f"{self.name}: not connected ({self._closed_reason or 'not started'})")
        rid = self._next_id
        self._next_id += 1
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = (fut, op)
        if on_progress is not None:
            self._listeners[rid] = on_progress
        line = json.dumps({"id": rid, "op": op, "params": params or {}}) + "\n"
        try:
            self._writer.write(line.encode())
            await self._writer.drain()
        except Exception as e:  # OSError, or the transport's own (asyncssh.ConnectionLost...)
            self._pending.pop(rid, None)
            self._listeners.pop(rid, None)
            if op in ACTING_OPS:
                raise OutcomeUnknown(
                    f"{self.name}: could not send {op}: {e}",
                    "re-list the host and reconcile; do not repeat the action blindly",
                ) from None
            raise HostError(f"{self.name}: could not send {op}: {e}") from None
        try:
            msg = await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.CancelledError:
            # The caller is gone (a front end stopping cancels its refresh): forget the request,
            # so that closing the channel sets no error on a future nobody will ever await (it
            # was printed as "Future exception was never retrieved" after `watch` stopped).
            self._pending.pop(rid, None)
            self._listeners.pop(rid, None)
            raise
        except asyncio.TimeoutError:
            self._pending.pop(rid, None)
            self._listeners.pop(rid, None)
            if op in ACTING_OPS:
                raise OutcomeUnknown(
                    f"{self.name}: no reply to {op} within {timeout:g} s; outcome unknown",
                    "re-list the host and reconcile; do not repeat the action blindly",
                ) from None
            raise HostError(f"{self.name}: no reply to {op} within {timeout:g} s") from None
        if msg.get("ok"):
            result = msg.get("result")
            return result if isinstance(result, dict) else {"value": result}
        kind = str(msg.get("kind") or "error")
        raise AgentError(f"{self.name}: {op} failed ({kind}): {msg.get('error')}")

    async def close(self) -> None:
        """Stop reading; pending requests fail. Closing the writer is the transport's job."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        self._fail_pending("the channel was closed")


def _parse(text: str) -> dict[str, Any] | None:
    """A protocol message in ``text``, tolerating a banner glued to its start."""
    line = text.strip()
    start = line.find('{"id"')
    if start < 0:
        return None
    try:
        msg = json.loads(mask_json_text(line[start:]))
    except ValueError:
        return None
    if not isinstance(msg, dict) or not isinstance(msg.get("id"), int):
        return None
    return msg
