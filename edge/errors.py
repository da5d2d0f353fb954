"""Typed errors with structured fields.

Every error the runtime raises on purpose derives from `EdgeError`. Each class
carries the facts as fields (not only in a message) so that the CLI and the HTTP
layer can map it in one place: `edge/api/errors.py` maps `kind` to an HTTP status,
and the CLI prints `str(err)` as one line and exits non-zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class ErrorKind(str, Enum):
    """Broad class of an error; the HTTP layer maps each to one status code."""

    INVALID_REQUEST = "invalid_request"  # 400
    UNAUTHORIZED = "unauthorized"  # 401
    NOT_FOUND = "not_found"  # 404
    TOO_LARGE = "too_large"  # 413
    INSUFFICIENT_STORAGE = "insufficient_storage"  # 507: the model cannot fit this box's memory budget
    UNAVAILABLE = "unavailable"  # 503 with Retry-After
    RATE_LIMITED = "rate_limited"  # 429 with Retry-After
    INTERNAL = "internal"  # 500: a bug or a backend failure, never bad input


class EdgeError(Exception):
    """Base of all deliberate errors. Subclasses are dataclasses with fields.

    `retry_after_s` and `param` are declared here, None unless a subclass sets them, so the HTTP
    mapping, the CLI and `edge sim` read them from any error without probing for attributes."""

    kind: ErrorKind = ErrorKind.INTERNAL
    retry_after_s: float | None = None  # how long a client should wait before retrying
    param: str | None = None  # the request parameter (or setting) at fault

    def __str__(self) -> str:  # pragma: no cover - overridden by every subclass
        return self.__class__.__name__


# --- models, files, store -------------------------------------------------


@dataclass
class ModelNotFound(EdgeError):
    name: str
    hint: str = ""
    kind = ErrorKind.NOT_FOUND

    def __str__(self) -> str:
        msg = f"model not found: {self.name}"
        return f"{msg} ({self.hint})" if self.hint else msg


@dataclass
class InvalidGGUF(EdgeError):
    """The file is not a well-formed GGUF file; `reason` names the first problem."""

    path: str
    reason: str
    offset: int | None = None
    kind = ErrorKind.INVALID_REQUEST

    def __str__(self) -> str:
        where = f" at byte {self.offset}" if self.offset is not None else ""
        return f"invalid GGUF file {self.path}: {self.reason}{where}"


@dataclass
class DownloadError(EdgeError):
    source: str
    reason: str
    kind = ErrorKind.UNAVAILABLE

    def __str__(self) -> str:
        return f"download failed for {self.source}: {self.reason}"


@dataclass
class ChecksumMismatch(EdgeError):
    source: str
    expected_sha256: str
    actual_sha256: str
    kind = ErrorKind.INTERNAL

    def __str__(self) -> str:
        return (
            f"checksum mismatch for {self.source}: expected sha256 {self.expected_sha256}, "
            f"got {self.actual_sha256}; the file was discarded"
        )


@dataclass
class ModelLoadError(EdgeError):
    path: str
    reason: str
    kind = ErrorKind.UNAVAILABLE

    def __str__(self) -> str:
        return f"could not load model {self.path}: {self.reason}"


@dataclass
class DraftVocabMismatch(EdgeError):
    """A draft model for speculative decoding must tokenize exactly as the served model does.

    `target_vocab` / `draft_vocab` describe each vocabulary (type and size); `reason` is the
    first difference found (a token id whose text differs, a special token, the size)."""

    target: str
    target_vocab: str
    draft: str
    draft_vocab: str
    reason: str
    kind = ErrorKind.INVALID_REQUEST

    def __str__(self) -> str:
        return (
            f"draft model {self.draft} ({self.draft_vocab}) cannot draft for {self.target} "
            f"({self.target_vocab}): {self.reason}; a draft model needs the same vocabulary"
        )


@dataclass
class InsufficientMemory(EdgeError):
    need_bytes: int
    available_bytes: int
    what: str = "model"
    kind = ErrorKind.UNAVAILABLE

    def __str__(self) -> str:
        return (
            f"not enough memory for {self.what}: needs {self.need_bytes / 2**20:.0f} MiB, "
            f"{self.available_bytes / 2**20:.0f} MiB available"
        )


@dataclass
class ModelTooLarge(EdgeError):
    """A model larger than the whole memory budget of the model host: nothing is unloaded for it."""

    name: str
    need_bytes: int
    budget_bytes: int
    detail: str = ""
    kind = ErrorKind.INSUFFICIENT_STORAGE

    def __str__(self) -> str:
        msg = (f"model {self.name} needs {self.need_bytes / 2**20:.0f} MiB, more than the memory budget of "
               f"{self.budget_bytes / 2**20:.0f} MiB for all resident models (--memory-budget)")
        return f"{msg}: {self.detail}" if self.detail else msg


@dataclass
class ConfigError(EdgeError):
    field: str
    reason: str
    kind = ErrorKind.INVALID_REQUEST

    def __post_init__(self) -> None:
        self.param = self.field

    def __str__(self) -> str:
        return f"invalid setting {self.field}: {self.reason}"


# --- requests -------------------------------------------------------------


@dataclass
class InvalidRequest(EdgeError):
    """Bad input from a caller; `param` names the offending parameter when there is one."""

    message: str
    param: str | None = None
    kind = ErrorKind.INVALID_REQUEST

    def __str__(self) -> str:
        return self.message


@dataclass
class ContextOverflow(EdgeError):
    n_prompt: int
    n_ctx: int
    kind = ErrorKind.INVALID_REQUEST

    def __str__(self) -> str:
        return (
            f"prompt is {self.n_prompt} tokens but the context holds {self.n_ctx}; "
            "shorten the prompt or start the server with a larger --ctx"
        )


@dataclass
class TemplateError(EdgeError):
    reason: str
    kind = ErrorKind.INVALID_REQUEST

    def __str__(self) -> str:
        return f"chat template failed: {self.reason}"


@dataclass
class QueueFull(EdgeError):
    max_queue: int
    retry_after_s: float = 1.0
    kind = ErrorKind.UNAVAILABLE

    def __str__(self) -> str:
        return f"server busy: {self.max_queue} requests already waiting; retry later"


@dataclass
class DevicePaused(EdgeError):
    """Admission is closed because the device is hot or short of memory."""

    reason: str
    retry_after_s: float = 5.0
    kind = ErrorKind.UNAVAILABLE

    def __str__(self) -> str:
        return f"device paused: {self.reason}; retry later"


@dataclass
class RequestShed(EdgeError):
    """Background work cancelled to protect the device (memory or heat)."""

    reason: str
    retry_after_s: float = 30.0
    kind = ErrorKind.UNAVAILABLE

    def __str__(self) -> str:
        return f"background request shed: {self.reason}"


@dataclass
class DecodeFailed(EdgeError):
    """llama_decode returned an error for a batch holding this request."""

    status: int
    reason: str = ""
    kind = ErrorKind.INTERNAL

    def __str__(self) -> str:
        return f"llama_decode failed (status {self.status}){': ' + self.reason if self.reason else ''}"


@dataclass
class EngineStopped(EdgeError):
    reason: str = "engine is shutting down"
    kind = ErrorKind.UNAVAILABLE

    def __str__(self) -> str:
        return self.reason


# --- HTTP API (appended by the API engineer) --------------------------------


@dataclass
class Unauthorized(EdgeError):
    """Missing or wrong API key."""

    reason: str = "missing or invalid API key"
    kind = ErrorKind.UNAUTHORIZED

    def __str__(self) -> str:
        return f"{self.reason}; send 'Authorization: Bearer <key>'"


@dataclass
class BodyTooLarge(EdgeError):
    limit_bytes: int
    kind = ErrorKind.TOO_LARGE

    def __str__(self) -> str:
        return f"request body exceeds the {self.limit_bytes} byte limit"


@dataclass
class KvCacheFull(EdgeError):
    """The request's KV need does not fit the free KV cells now; it may later."""

    need_cells: int
    free_cells: int
    retry_after_s: float = 2.0
    kind = ErrorKind.UNAVAILABLE

    def __str__(self) -> str:
        return (
            f"KV cache full: request needs {self.need_cells} cells (prompt + max_tokens), "
            f"{self.free_cells} free; retry later or lower max_tokens"
        )


@dataclass
class ServerError(EdgeError):
    """An HTTP client command (`edge chat --url`, `edge status`) got an error from the server."""

    status: int
    message: str
    kind = ErrorKind.UNAVAILABLE

    def __str__(self) -> str:
        return f"server answered {self.status}: {self.message}"


@dataclass
class ResponseNotFound(EdgeError):
    """`GET/DELETE /v1/responses/{id}`: no such stored response (never stored, evicted, or expired)."""

    response_id: str
    kind = ErrorKind.NOT_FOUND

    def __str__(self) -> str:
        return (f"response {self.response_id!r} not found (responses are kept in memory, bounded in "
                "number, size and age, and only when sent with store: true)")


@dataclass
class PreviousResponseNotFound(EdgeError):
    """`previous_response_id` names a response this server no longer (or never) kept."""

    response_id: str
    field: str = "previous_response_id"
    kind = ErrorKind.NOT_FOUND

    def __post_init__(self) -> None:
        self.param = self.field

    def __str__(self) -> str:
        return (f"previous response {self.response_id!r} not found: it was never stored (store: false), "
                "or it was evicted or expired from this server's bounded in-memory store; send the "
                "conversation as input items instead")
