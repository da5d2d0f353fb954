"""`POST /v1/embeddings`, OpenAI shape: vectors for retrieval, from the served model's weights
(or the embeddings model named in the settings), on the engine's own embeddings context.

Inputs: a string, a list of strings, a list of token ids, or a list of such lists.
`encoding_format` float (JSON numbers) or base64 (little-endian float32, as the
OpenAI SDK decodes it); `dimensions` is refused unless it is the model's own
size (these models are not trained to be shortened). Tokenizing runs off the
event loop; a client that goes away cancels its queued batches.
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

from edge.api.body import parse_json
from edge.api.schemas import EmbeddingRequest, parse_model, request_body_doc
from edge.api.state import ApiState
from edge.errors import InvalidRequest, QueueFull
from edge.runtime.types import EmbedJobLike

router = APIRouter()
MAX_IN_FLIGHT = 32  # embedding requests queued at once; beyond: 503 + Retry-After


def _encode(vec: Any, fmt: str) -> list[float] | str:
    values = [float(x) for x in vec]
    if fmt == "base64":
        return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")
    return values


async def _run(st: ApiState, inputs: list[str | list[int]], truncate: bool) -> tuple[list[Any], int]:
    # tokenizing: off the loop
    job: EmbedJobLike = await anyio.to_thread.run_sync(partial(st.engine.embed, inputs, truncate))
    try:
        vectors = await asyncio.wrap_future(job.future)  # a cancelled request cancels the queued job
    finally:
        job.future.cancel()  # no-op once it is done
    return vectors, job.n_tokens


async def embed_inputs(st: ApiState, model: str, inputs: list[str | list[int]], dimensions: int | None,
                       *, truncate: bool = False) -> tuple[list[Any], int]:
    """The checks and the bounded queue both embeddings APIs share (OpenAI's and Ollama's):
    (one vector per input, input tokens). `model` is the name as sent (Ollama's ":latest" dropped)."""
    info = await anyio.to_thread.run_sync(st.engine.embedding_info)
    names = {info["model"], *st.model_names} if st.settings.embedding_model is None else {info["model"]}
    if model not in names:
        st.check_model(model)  # ModelNotFound naming what this server serves
        raise InvalidRequest(f"embeddings here come from {info['model']!r}", "model")
    if dimensions is not None and dimensions != info["n_embd"]:
        raise InvalidRequest(f"dimensions={dimensions}: {info['model']} gives "
                             f"{info['n_embd']}-dimensional vectors and cannot shorten them", "dimensions")
    if st.embeds_in_flight >= MAX_IN_FLIGHT:
        raise QueueFull(MAX_IN_FLIGHT, retry_after_s=1.0)
    st.embeds_in_flight += 1
    try:
        return await _run(st, inputs, truncate)
    finally:
        st.embeds_in_flight -= 1


@router.post("/v1/embeddings", openapi_extra=request_body_doc(EmbeddingRequest))
async def embeddings(request: Request) -> Response:
    st: ApiState = request.app.state.edge
    body = parse_model(EmbeddingRequest, parse_json(await request.body()))  # nesting bounded first
    vectors, n_tokens = await embed_inputs(st, body.model, body.inputs(), body.dimensions)
    return JSONResponse({
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)}
                 for i, v in enumerate(vectors)],
        "model": body.model,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    })
