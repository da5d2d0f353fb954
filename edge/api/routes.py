"""Route rules for the routes `edge serve` includes before its first answer.

FastAPI builds a pydantic field at start for each typed parameter of a route and for each return
annotation it takes as a response model, and the first such field imports `pydantic.v1` (to
refuse v1 models): 30-35 ms on a 2-core VM, on the one Python thread the first token of a start
waits for. So those routes (api/openai.py, api/ops.py) read their query and path parameters from
the request and pass `response_model=None`; their bodies are plain JSON either way. The
parameters stay in the OpenAPI document through `openapi_extra` built here. Routes included
after the start (api/late_routes.py) keep FastAPI's typed parameters.
"""

from __future__ import annotations

from typing import Any


def _param(where: str, name: str, description: str, required: bool) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required, "description": description,
            "schema": {"type": "string"}}


def query_doc(name: str, description: str) -> dict[str, Any]:
    """`openapi_extra` for a route that reads the optional string query parameter `name`."""
    return {"parameters": [_param("query", name, description, False)]}


def path_doc(name: str, description: str) -> dict[str, Any]:
    """`openapi_extra` for a route that reads the path parameter `name` from its path."""
    return {"parameters": [_param("path", name, description, True)]}
