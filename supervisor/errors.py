"""The error hierarchy of runwatch, drawn once.

Every error says what happened and, where there is one, what to do about it (``hint``). The CLI
prints ``str(error)`` and exits with ``error.exit_code``.
"""

from __future__ import annotations


class RunwatchError(Exception):
    """Base of every error runwatch raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  -> {self.hint}" if self.hint else self.message


class ConfigError(RunwatchError):
    """The configuration file is missing, unreadable or invalid (exit status 2)."""

    exit_code = 2


class UsageError(RunwatchError):
    """The command line asks for something that cannot be done as asked (exit status 2)."""

    exit_code = 2


class HostError(RunwatchError):
    """A host could not be reached or did not answer in time."""


class HostKeyError(HostError):
    """The host's key is unknown or changed; nothing was sent to it."""


class AgentError(HostError):
    """The host agent answered with an error or broke the protocol."""


class OutcomeUnknown(HostError):
    """An action was sent but its outcome was not confirmed (for example the connection dropped).

    The caller must re-list and reconcile; it must never assume success or repeat blindly.
    """


class KillRefused(RunwatchError):
    """The process named by an identity is not the one that was listed (PID reused...)."""


class RestartCancelled(RunwatchError):
    """An automatic restart whose intent was cancelled (a kill of the run, from any front end)
    before it could take the run's lock: nothing was started."""


class LaunchError(RunwatchError):
    """A run could not be launched, or did not stay alive long enough to be confirmed."""


class StepFailed(RunwatchError):
    """A step of a plan failed; the message says what happened and the hint what to do."""


class EndpointError(RunwatchError):
    """An OpenAI-compatible endpoint could not be benchmarked."""


class UnsafeState(RunwatchError):
    """A file or directory runwatch keeps (state dir, audit log, run log) is a link, another
    user's, or writable by others: refused, as OpenSSH's StrictModes refuses such files."""
