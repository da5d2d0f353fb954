"""`POST /v1/embeddings`, OpenAI shape: vectors for retrieval, from the served model's weights
(or the embeddings model named in the settings), on the engine's own embeddings context.

Inputs: a string, a list of strings, a list of token ids, or a list of such lists.
`encoding_format` float (JSON numbers) or base64 (little-endian float32, as the
OpenAI SDK decodes it); `dimensions` is refused unless it is the model's own
size (these models are not trained to be shortened). Tokenizing runs off the
event loop; a client that goes away cancels its queued batches.

Embeddings go through the same `Admission` as generation (admitted before the engine sees
them, released when done): one queue bound, the same heat and memory refusals, the same
Retry-After, and `X-Edge-Priority` counts here too. A request claims no KV cells of the
generation cache (the embeddings context is its own), only a place in the queue.
"""

from __future__ import annotations

import asyncio
import base64
import struct
from functools import partial
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from edge.api.audit import tally
from edge.api.body import parse_json
from edge.api.generation import PRIORITY_HEADER, parse_priority
from edge.api.schemas import EmbeddingRequest, parse_model, request_body_doc
from edge.api.state import ApiState
from edge.errors import EdgeError, InvalidRequest
from edge.runtime.types import EmbedJobLike, Priority
from edge.scheduler.admission import TicketLike

router = APIRouter()
NO_KV_CELLS = (0, 0)  # (prompt, max tokens) an embeddings request claims of the generation KV cache


def _encode(vec: Any, fmt: str) -> list[float] | str:
    values = [float(x) for x in vec]
    if fmt == "base64":
        return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")
    return values


class _Claim:
    """An admitted embeddings request: its ticket, and the engine job once submitted, so that a
    shed (the scheduler protecting the device) cancels the job and answers with its error."""

    def __init__(self, ticket: TicketLike) -> None:
        self.ticket = ticket
        self.job: EmbedJobLike | None = None
        self.shed: EdgeError | None = None
        ticket.bind(self._on_shed)

    def _on_shed(self, err: EdgeError) -> None:  # any thread
        self.shed = err
        if self.job is not None:
            self.job.future.cancel()

    async def run(self, st: ApiState, inputs: list[str | list[int]], truncate: bool) -> tuple[list[Any], int]:
        # tokenizing: off the loop
        self.job = job = await anyio.to_thread.run_sync(partial(st.engine.embed, inputs, truncate))
        try:
            if self.shed is not None:
                raise self.shed
            vectors = await asyncio.wrap_future(job.future)  # a cancelled request cancels the queued job
        except asyncio.CancelledError:
            if self.shed is not None:  # cancelled by the shed, not by the client
                raise self.shed from None
            raise
        finally:
            job.future.cancel()  # no-op once it is done
        return vectors, job.n_tokens


async def embed_inputs(st: ApiState, model: str, inputs: list[str | list[int]], dimensions: int | None,
                       *, truncate: bool = False,
                       priority: Priority = Priority.INTERACTIVE) -> tuple[list[Any], int]:
    """The checks and the admission both embeddings APIs share (OpenAI's and Ollama's):
    (one vector per input, input tokens). `model` is the name as sent (Ollama's ":latest" dropped)."""
    info = await anyio.to_thread.run_sync(st.engine.embedding_info)
    own = st.settings.embedding_model is None or st.host is not None  # a hosted model embeds with its own
    names = {info["model"], *st.model_names} if own else {info["model"]}
    if model not in names:
        st.check_model(model)  # ModelNotFound naming what this server serves
        raise InvalidRequest(f"embeddings here come from {info['model']!r}", "model")
    if dimensions is not None and dimensions != info["n_embd"]:
        raise InvalidRequest(f"dimensions={dimensions}: {info['model']} gives "
                             f"{info['n_embd']}-dimensional vectors and cannot shorten them", "dimensions")
    claim = _Claim(st.admission.admit_all(priority, [NO_KV_CELLS])[0])  # 503 + Retry-After when refused
    try:
        vectors, n_tokens = await claim.run(st, inputs, truncate)
    finally:
        claim.ticket.release()
    tally(model=info["model"], prompt_tokens=n_tokens)  # the audit line's model and tokens
    return vectors, n_tokens


@router.post("/v1/embeddings", openapi_extra=request_body_doc(EmbeddingRequest))
async def embeddings(request: Request) -> Response:
    st: ApiState = request.app.state.edge
    body = parse_model(EmbeddingRequest, parse_json(await request.body()))  # nesting bounded first
    priority = parse_priority(request.headers.get(PRIORITY_HEADER))
    st = await st.for_model(request, body.model)
    vectors, n_tokens = await embed_inputs(st, body.model, body.inputs(), body.dimensions, priority=priority)
    return JSONResponse({
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
                 for i, v in enumerate(vectors)],
        "model": body.model,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    })
