"""Typed errors of the load test; `edge.commands.exits` maps them to exit statuses
(2 for an unreachable URL, 3 when a server it had to start did not come up)."""

from __future__ import annotations

from dataclasses import dataclass

from edge.errors import EdgeError, ErrorKind


@dataclass
class TargetUnreachable(EdgeError):
    """A target URL did not answer /v1/models (nothing listening, or not OpenAI-compatible)."""

    url: str
    reason: str
    kind = ErrorKind.UNAVAILABLE

    def __str__(self) -> str:
        return f"target {self.url} unreachable: {self.reason}"


@dataclass
class TargetStartFailed(EdgeError):
    """A server the bench launched exited or never became ready; `log_tail` says why."""

    target: str
    reason: str
    log_tail: str = ""
    kind = ErrorKind.UNAVAILABLE

    def __str__(self) -> str:
        tail = f"\n--- last lines of its log ---\n{self.log_tail}" if self.log_tail else ""
        return f"target {self.target} failed to start: {self.reason}{tail}"
