"""Reference data-generation client: sends each dataset's prompts to an OpenAI-compatible endpoint
and appends one JSON line per response to ``<output-dir>/<dataset>/raw_responses.jsonl``::

    {"sample_id": "B2-000017", "output_ids": [...], "prompt_tokens": 312,
     "completion_tokens": 3514, "finish_reason": "stop"}

(with ``--legacy-format``: ``text`` instead of ``output_ids``, the older format).

Run as a script, like the real thing: ``python run_inference.py --datasets B1,B2 ...``. It needs
only the standard library and httpx.

Guarantees, which runwatch's supervision relies on:

- One line per response, written with a single ``write`` on an ``O_APPEND`` descriptor, so a line
  is never torn by this process (only a kill in the middle of that one call could tear it).
- Resume: sample_ids already in the file (current or legacy format) are skipped. An incomplete last
  line (no newline; left by a writer killed mid-write) is not counted: before appending, its bytes
  are moved to ``raw_responses.jsonl.torn`` and the file is truncated at its last newline, so new
  lines never glue onto a fragment.
- One writer per dataset file: an exclusive ``flock`` on it; a second writer exits with status 3.
- Stops a dataset when it holds ``--max-samples`` responses or ``--token-budget`` completion tokens:
  no new request starts after that (requests in flight still finish and are written).
- Retries 429 and 5xx answers, malformed answers and transport errors with exponential backoff,
  honouring ``Retry-After``; another 4xx fails that sample only (401, 403 and 404 stop the run).
- The API key is read from the environment variable named by ``--api-key-env``; never printed.
- With ``--ledger PATH`` (opt-in, for soak tests): after each line is written, one JSON line
  ``{"sample_id", "file", "dev", "ino", "offset", "length", "sha1", "time"}`` is appended to PATH
  and fsynced, so what the client wrote can be checked later against the data files.
"""

from __future__ import annotations

import argparse
import asyncio
import email.utils
import fcntl
import hashlib
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

DATA_FILE = "raw_responses.jsonl"
EXIT_LOCKED = 3
EXIT_FAILED = 1
EXIT_USAGE = 2


def log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp} {message}", flush=True)


class FatalError(Exception):
    """Stop the whole run (bad endpoint answer, too many failures in a row...)."""


# --------------------------------------------------------------------------- data file


@dataclass
class Resume:
    """What a dataset file already holds."""

    done: set[str] = field(default_factory=set)
    completion_tokens: int = 0
    lines: int = 0
    bad_lines: int = 0
    torn_bytes: int = 0


def _record_tokens(rec: dict[str, Any]) -> int:
    value = rec.get("completion_tokens")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    ids = rec.get("output_ids")
    if isinstance(ids, list):
        return len(ids)
    text = rec.get("text")
    return len(text.split()) if isinstance(text, str) else 0


def read_existing(path: Path) -> Resume:
    """Sample ids and completion tokens of the complete lines of ``path`` (any format)."""
    res = Resume()
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; streamed, the file may be large
    except FileNotFoundError:
        return res
    with f:
        for raw in f:
            if not raw.endswith(b"\n"):
                res.torn_bytes = len(raw)
                break
            if not raw.strip():
                continue
            res.lines += 1
            try:
                rec = json.loads(raw)
            except ValueError:
                res.bad_lines += 1
                continue
            sid = rec.get("sample_id") if isinstance(rec, dict) else None
            if not isinstance(sid, str) or not sid:
                res.bad_lines += 1
                continue
            if sid in res.done:
                continue  # a duplicate counts once
            res.done.add(sid)
            res.completion_tokens += _record_tokens(rec)
    return res


def move_torn_tail(path: Path, fd: int) -> int:
    """Move an incomplete last line to ``<path>.torn`` and truncate ``path`` at its last newline.

    Called with the writer's lock held. Returns the number of bytes moved (0 if none).
    """
    size = os.fstat(fd).st_size
    if size == 0:
        return 0
    keep = size
    block = 65536
    with open(path, "rb") as f:
        while keep > 0:
            start = max(0, keep - block)
            f.seek(start)
            chunk = f.read(keep - start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            keep = start
        if keep == size:
            return 0
        f.seek(keep)
        tail = f.read(size - keep)
    with open(str(path) + ".torn", "ab") as t:
        t.write(tail + b"\n")
        t.flush()
        os.fsync(t.fileno())
    os.ftruncate(fd, keep)
    os.fsync(fd)
    return size - keep


def write_line(fd: int, record: dict[str, Any]) -> bytes:
    """Append one record as one line with a single write (retried only if the kernel wrote less).

    Returns the bytes written.
    """
    data = (json.dumps(record) + "\n").encode()
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    return data


class Ledger:
    """The client's own record of each line it wrote: where (file, inode, offset) and its sha1.

    Each entry is appended with one write and fsynced before the next line is written, so an entry
    exists only for a line that was completely written to the data file.
    """

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(self, path: Path, fd: int, sample_id: str, data: bytes) -> None:
        st = os.fstat(fd)
        end = os.lseek(fd, 0, os.SEEK_CUR)  # O_APPEND: the position is just past our line
        entry = {
            "sample_id": sample_id,
            "file": str(path.resolve()),
            "dev": st.st_dev,
            "ino": st.st_ino,
            "offset": end - len(data),
            "length": len(data),
            "sha1": hashlib.sha1(data).hexdigest(),
            "pid": os.getpid(),
            "time": time.time(),
        }
        os.write(self.fd, (json.dumps(entry) + "\n").encode())
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


# --------------------------------------------------------------------------- prompts


def load_prompts(path: Path) -> list[tuple[str, list[dict[str, Any]]]]:
    """(sample_id, messages) of each prompt line; lines with ``prompt`` become one user message."""
    out: list[tuple[str, list[dict[str, Any]]]] = []
    seen: set[str] = set()
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                log(f"{path}:{n}: not JSON, skipped")
                continue
            sid = rec.get("sample_id", rec.get("id")) if isinstance(rec, dict) else None
            if sid is None:
                log(f"{path}:{n}: no sample_id, skipped")
                continue
            sid = str(sid)
            messages = rec.get("messages")
            if not isinstance(messages, list):
                prompt = rec.get("prompt")
                if not isinstance(prompt, str):
                    log(f"{path}:{n}: neither messages nor prompt, skipped")
                    continue
                messages = [{"role": "user", "content": prompt}]
            if sid in seen:
                continue
            seen.add(sid)
            out.append((sid, messages))
    return out


# --------------------------------------------------------------------------- requests


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


@dataclass
class Client:
    http: httpx.AsyncClient
    model: str
    max_tokens: int | None
    temperature: float | None
    legacy: bool
    max_retries: int
    rng: random.Random = field(default_factory=random.Random)
    retries: int = 0

    async def complete(self, sample_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The record to write for one prompt (retrying per policy); raises on permanent failure."""
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if not self.legacy:
            body["return_token_ids"] = True
        attempt = 0
        while True:
            delay: float | None = None
            why = ""
            try:
                r = await self.http.post("/chat/completions", json=body)
            except httpx.TransportError as e:
                why = f"{type(e).__name__}"
            else:
                if r.status_code == 200:
                    try:
                        return self._record(sample_id, r)
                    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
                        why = f"malformed answer ({type(e).__name__}: {e})"
                elif r.status_code in (401, 403, 404):  # wrong key, model or URL: stop
                    raise FatalError(f"HTTP {r.status_code} from the endpoint: {r.text[:200]}")
                elif r.status_code != 429 and r.status_code < 500:  # this prompt only: skip it
                    raise RuntimeError(f"{sample_id}: HTTP {r.status_code}: {r.text[:200]}")
                else:
                    why = f"HTTP {r.status_code}"
                    delay = _retry_after(r)
            attempt += 1
            if attempt > self.max_retries:
                raise RuntimeError(f"{sample_id}: giving up after {attempt} attempts ({why})")
            if delay is None:
                delay = min(30.0, 0.5 * 2 ** (attempt - 1)) * (0.5 + self.rng.random() / 2)
            self.retries += 1
            await asyncio.sleep(min(delay, 120.0))  # backoff before retrying

    def _record(self, sample_id: str, r: httpx.Response) -> dict[str, Any]:
        data = r.json()
        choice = data["choices"][0]
        usage = data.get("usage") or {}
        rec: dict[str, Any] = {"sample_id": sample_id}
        if self.legacy:
            rec["text"] = choice["message"].get("content") or ""
            completion = usage.get("completion_tokens")
        else:
            ids = choice.get("token_ids")
            if not isinstance(ids, list):
                raise FatalError(
                    "the endpoint did not return token ids (return_token_ids); "
                    "use --legacy-format to store text instead"
                )
            rec["output_ids"] = ids
            completion = usage.get("completion_tokens", len(ids))
        prompt_tokens = usage.get("prompt_tokens")
        if prompt_tokens is None and isinstance(data.get("prompt_token_ids"), list):
            prompt_tokens = len(data["prompt_token_ids"])
        rec["prompt_tokens"] = prompt_tokens
        rec["completion_tokens"] = completion
        rec["finish_reason"] = choice.get("finish_reason")
        return rec


# --------------------------------------------------------------------------- one dataset


@dataclass
class Progress:
    samples: int
    tokens: int
    inflight: int = 0
    written: int = 0
    failed: int = 0
    failed_in_a_row: int = 0


async def run_dataset(args: argparse.Namespace, client: Client, dataset: str) -> None:
    prompts_path = Path(args.prompts_dir) / f"{dataset}.jsonl"
    if not prompts_path.is_file():
        raise FatalError(f"{dataset}: no prompts file {prompts_path}")
    out_dir = Path(args.output_dir) / dataset
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / DATA_FILE
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"{dataset}: {path} is being written by another process; exiting")
            sys.exit(EXIT_LOCKED)
        moved = move_torn_tail(path, fd)
        if moved:
            log(f"{dataset}: moved an incomplete last line ({moved} bytes) to {path}.torn")
        existing = read_existing(path)
        prompts = load_prompts(prompts_path)
        todo = [(sid, m) for sid, m in prompts if sid not in existing.done]
        prog = Progress(samples=len(existing.done), tokens=existing.completion_tokens)
        log(
            f"{dataset}: {prog.samples} samples and {prog.tokens} completion tokens already in "
            f"{path} ({existing.bad_lines} bad lines); {len(todo)} of {len(prompts)} prompts to go"
        )
        ledger = Ledger(args.ledger) if args.ledger else None
        try:
            await _generate(args, client, dataset, fd, todo, prog, path, ledger)
        finally:
            if ledger is not None:
                ledger.close()
        log(f"{dataset}: done: {prog.samples} samples, {prog.tokens} completion tokens")
    finally:
        os.close(fd)


def _limit_reached(args: argparse.Namespace, prog: Progress) -> str | None:
    if args.max_samples is not None and prog.samples + prog.inflight >= args.max_samples:
        return f"--max-samples {args.max_samples}"
    if args.token_budget is not None and prog.tokens >= args.token_budget:
        return f"--token-budget {args.token_budget}"
    return None


async def _generate(
    args: argparse.Namespace,
    client: Client,
    dataset: str,
    fd: int,
    todo: list[tuple[str, list[dict[str, Any]]]],
    prog: Progress,
    path: Path,
    ledger: Ledger | None = None,
) -> None:
    sem = asyncio.Semaphore(args.concurrency)
    tasks: set[asyncio.Task[None]] = set()
    fatal: list[BaseException] = []
    last_report = time.monotonic()

    async def one(sample_id: str, messages: list[dict[str, Any]]) -> None:
        try:
            rec = await client.complete(sample_id, messages)
        except FatalError as e:
            fatal.append(e)
            return
        except Exception as e:  # a failed sample is reported and skipped, not fatal
            prog.failed += 1
            prog.failed_in_a_row += 1
            log(f"{dataset}: {e}")
            if prog.failed_in_a_row >= args.max_failures:
                fatal.append(FatalError(f"{prog.failed_in_a_row} samples failed in a row"))
            return
        finally:
            prog.inflight -= 1
            sem.release()
        data = write_line(fd, rec)
        if ledger is not None:
            ledger.record(path, fd, sample_id, data)
        prog.failed_in_a_row = 0
        prog.samples += 1
        prog.written += 1
        prog.tokens += int(rec.get("completion_tokens") or 0)

    for sample_id, messages in todo:
        await sem.acquire()
        reason = _limit_reached(args, prog)
        if reason is not None or fatal:
            sem.release()
            if reason is not None:
                log(f"{dataset}: {reason} reached; no new requests")
            break
        prog.inflight += 1
        task = asyncio.get_running_loop().create_task(one(sample_id, messages))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        now = time.monotonic()
        if now - last_report >= args.report_seconds:
            last_report = now
            log(
                f"{dataset}: {prog.samples} samples, {prog.tokens} completion tokens, "
                f"{prog.inflight} in flight, {client.retries} retries, {prog.failed} failed"
            )
    if tasks:
        await asyncio.gather(*tasks)
    if fatal:
        raise FatalError(f"{dataset}: {fatal[0]}")


# --------------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Generate responses for datasets of prompts.")
    p.add_argument("--datasets", required=True, help="comma-separated dataset names, e.g. B1,B2")
    p.add_argument("--prompts-dir", default="prompts", help="holds <dataset>.jsonl prompt files")
    p.add_argument("--output-dir", default="out", help="writes <dataset>/raw_responses.jsonl")
    p.add_argument("--api-base", default="http://127.0.0.1:30000/v1", help="base URL with /v1")
    p.add_argument("--model", default=None, help="default: the first model the endpoint lists")
    p.add_argument("--api-key-env", default=None, help="NAME of the variable holding the API key")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    p.add_argument("--max-samples", type=int, default=None, help="responses per dataset")
    p.add_argument("--token-budget", type=int, default=None, help="completion tokens per dataset")
    p.add_argument("--max-tokens", type=int, default=None, help="max_tokens of each request")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--legacy-format", action="store_true", help="store text, not output_ids")
    p.add_argument("--max-retries", type=int, default=8, help="retries of one request")
    p.add_argument("--max-failures", type=int, default=20, help="failed samples in a row to stop")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--report-seconds", type=float, default=10.0, help="progress log interval")
    p.add_argument(
        "--ledger",
        default=None,
        metavar="PATH",
        help="append where each written line is (file, offset, sha1) to PATH, fsynced",
    )
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _parser()
    args = p.parse_args(argv)
    args.datasets = [d for d in args.datasets.split(",") if d]
    if not args.datasets:
        p.error("--datasets: no dataset named")
    for d in args.datasets:
        if "/" in d or d in (".", ".."):
            p.error(f"--datasets: not a dataset name: {d!r}")
    if args.concurrency < 1:
        p.error("--concurrency must be at least 1")
    return args


async def amain(args: argparse.Namespace) -> int:
    headers = {}
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            log(f"environment variable {args.api_key_env} is not set (it must hold the API key)")
            return EXIT_USAGE
        headers["Authorization"] = f"Bearer {key}"
    limits = httpx.Limits(
        max_connections=args.concurrency, max_keepalive_connections=args.concurrency
    )
    timeout = httpx.Timeout(args.request_timeout, connect=30.0)
    base = args.api_base.rstrip("/")
    async with httpx.AsyncClient(
        base_url=base, headers=headers, limits=limits, timeout=timeout
    ) as http:
        model = args.model
        if not model:
            try:
                r = await http.get("/models")
                if r.status_code != 200:
                    log(f"cannot list the models of {base}: HTTP {r.status_code}")
                    return EXIT_FAILED
                model = r.json()["data"][0]["id"]
            except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as e:
                log(f"cannot list the models of {base} ({type(e).__name__}); pass --model")
                return EXIT_FAILED
        client = Client(
            http=http,
            model=model,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            legacy=args.legacy_format,
            max_retries=args.max_retries,
        )
        log(
            f"pid {os.getpid()}: datasets {','.join(args.datasets)} -> {base} (model {model}), "
            f"concurrency {args.concurrency}, max samples {args.max_samples}, "
            f"token budget {args.token_budget}"
        )
        for dataset in args.datasets:
            try:
                await run_dataset(args, client, dataset)
            except FatalError as e:
                log(f"stopping: {e}")
                return EXIT_FAILED
    log("all datasets done")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(amain(args))
    except KeyboardInterrupt:
        log("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
