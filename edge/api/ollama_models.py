"""Ollama's model routes: GET /api/tags, /api/ps, /api/version; POST /api/show, /api/pull;
DELETE /api/delete.

Under the model host, /api/tags lists every model in the store and /api/ps the resident ones
(size as planned, expires_at); a server without a host lists its one model (under Ollama's
"name:latest" convention; requests may use either spelling). A model's facts come from its
GGUF header (`edge.gguf`), read once: family = architecture, parameter size,
quantization level, the chat template and `capabilities` (`completion`; `tools` when the
template renders tool definitions; `thinking` when it has a think block; `embedding`, since
/api/embed works with every model).
Pull and delete act on the model store (`edge.store`): catalog names only, progress
streamed as Ollama streams it (status lines, then digest/total/completed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from edge.api.build import running
from edge.api.errors import ollama_payload, to_http
from edge.api.generation import template_info
from edge.api.ollama_schemas import DeleteRequest, PullRequest, ShowRequest, ollama_body_doc
from edge.api.ollama_support import served_name, state_of, untagged
from edge.api.respond import NdjsonStream, json_body, ndjson_line
from edge.api.schemas import parse_model
from edge.api.state import ApiState
from edge.errors import EdgeError, InvalidRequest, ModelNotFound
from edge.gguf import GGUFInfo, validated
from edge.host.residency import ModelState
from edge.planner import MemoryPlan
from edge.store import ModelStore, sha256_file, store_for

router = APIRouter()
log = logging.getLogger("edge.api")
# The Ollama release whose API this one follows. Clients gate features on the version
# (VS Code's Ollama provider wants >= 0.6.4), so edge's own version would read as "too old".
OLLAMA_API_VERSION = "0.12.6"
_FOREVER = timedelta(days=365 * 100)


def tagged(name: str) -> str:
    return name if ":" in name else f"{name}:latest"


def _rfc3339(t: datetime) -> str:
    return t.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def parameter_size(n: int) -> str:
    """Ollama's spelling: 135M, 494M, 1.2B, 7.6B."""
    if n >= 1_000_000_000:
        return f"{n / 1e9:.1f}B"
    if n >= 1_000_000:
        return f"{n / 1e6:.0f}M"
    return f"{n / 1e3:.0f}K"


def quantization_level(file_type: str | None) -> str:
    """"MOSTLY_Q4_K_M" -> "Q4_K_M", "ALL_F32" -> "F32" (as Ollama reports it)."""
    if not file_type:
        return "unknown"
    return file_type.removeprefix("MOSTLY_").removeprefix("ALL_").upper()


def _facts(st: ApiState) -> dict[str, Any]:
    """The served model's facts, from its GGUF header and the store (blocking; cached per app)."""
    if "facts" in st.ollama_cache:
        return st.ollama_cache["facts"]  # type: ignore[no-any-return]
    path = st.model_path
    facts: dict[str, Any] = {"size": 0, "digest": "", "modified_at": _rfc3339(datetime.now(timezone.utc)),
                             "details": {"parent_model": "", "format": "gguf", "family": "", "families": [],
                                         "parameter_size": "", "quantization_level": ""},
                             "model_info": {}, "license": ""}
    if path is not None and path.is_file():
        stat = path.stat()
        facts["size"] = stat.st_size
        facts["modified_at"] = _rfc3339(datetime.fromtimestamp(stat.st_mtime, timezone.utc))
        facts["digest"] = _digest(st, path)
        try:
            info = validated(path)
        except EdgeError:
            info = None
        if info is not None:
            facts.update(_gguf_facts(info))
    st.ollama_cache["facts"] = facts
    return facts


def _gguf_facts(info: GGUFInfo) -> dict[str, Any]:
    arch = info.architecture
    details = {"parent_model": "", "format": "gguf", "family": arch, "families": [arch],
               "parameter_size": parameter_size(info.n_params),
               "quantization_level": quantization_level(info.file_type)}
    scalars = {k: v for k, v in info.metadata.items()
               if isinstance(v, (str, int, float, bool)) and not k.startswith("tokenizer.chat_template")}
    model_info = {**scalars, "general.architecture": arch, "general.parameter_count": info.n_params,
                  f"{arch}.context_length": info.n_ctx_train, f"{arch}.embedding_length": info.n_embd,
                  f"{arch}.block_count": info.n_layer, f"{arch}.attention.head_count": info.n_head}
    template = info.metadata.get("tokenizer.chat_template")
    return {"details": details, "model_info": model_info, "license": info.license or "",
            "template": template if isinstance(template, str) else ""}


def _digest(st: ApiState, path: Path) -> str:
    """sha256 of the file: the store's record when it has one, else computed (once)."""
    with contextlib.suppress(EdgeError, OSError, ValueError):
        store = store_for(st.settings)
        for m in store.list():
            if Path(m.path).resolve() == path.resolve():
                return m.sha256
    return sha256_file(path)


async def facts_of(st: ApiState) -> dict[str, Any]:
    return await anyio.to_thread.run_sync(_facts, st)


def capabilities(st: ApiState) -> list[str]:
    info = template_info(st.engine)
    caps = ["completion"]
    if info is not None and info.tools:
        caps.append("tools")
    if info is not None and info.thinking is not None:
        caps.append("thinking")  # `think` works (edge.api.reasoning)
    caps.append("embedding")  # /api/embed pools the served model (or the configured embeddings model)
    return caps


def _entry(st: ApiState, facts: dict[str, Any]) -> dict[str, Any]:
    name = tagged(st.model_id)
    return {"name": name, "model": name, "modified_at": facts["modified_at"], "size": facts["size"],
            "digest": facts["digest"], "details": facts["details"]}


@router.get("/api/version")
async def version() -> dict[str, Any]:
    return {"version": OLLAMA_API_VERSION, **running()}  # edge's version and its llama.cpp build


@router.get("/api/tags")
async def tags(request: Request) -> dict[str, Any]:
    st = state_of(request)
    if st.host is not None:  # every model in the store
        views = [st.view_of(ref) for ref in st.host.names.all()]
        return {"models": [_entry(v, await facts_of(v)) for v in views]}
    return {"models": [_entry(st, await facts_of(st))]}


async def _hosted_ps(st: ApiState) -> dict[str, Any]:
    """The resident models: size as planned, when each would unload if it stays idle."""
    assert st.host is not None
    out = []
    for h in st.host.resident():
        if h.state is not ModelState.READY or h.engine is None:
            continue
        view = st.view_of(h.ref, h.engine)
        res = h.engine.residency_status()
        idle = h.leases == 0
        left = _FOREVER if h.keep_alive_s is None or not idle else timedelta(
            seconds=res.expires_in_s if res.expires_in_s is not None else h.keep_alive_s)
        out.append({**_entry(view, await facts_of(view)),
                    "expires_at": _rfc3339(datetime.now(timezone.utc) + left), "size": h.planned_bytes,
                    "size_vram": h.plan.gpu_bytes if h.plan is not None else 0,
                    "context_length": h.engine.n_ctx})
    return {"models": out}


@router.get("/api/ps")
async def ps(request: Request) -> dict[str, Any]:
    st = state_of(request)
    if st.host is not None:
        return await _hosted_ps(st)
    res = st.engine.residency_status()
    if not res.loaded:
        return {"models": []}
    facts = await facts_of(st)
    plan = st.plan if isinstance(st.plan, MemoryPlan) else None
    if res.keep_alive_s is None:
        left = _FOREVER
    else:
        left = timedelta(seconds=res.expires_in_s if res.expires_in_s is not None else res.keep_alive_s)
    return {"models": [{**_entry(st, facts), "expires_at": _rfc3339(datetime.now(timezone.utc) + left),
                        "size": plan.total_bytes if plan is not None else facts["size"],
                        "size_vram": plan.gpu_bytes if plan is not None else 0,
                        "context_length": st.engine.n_ctx}]}


@router.post("/api/show", openapi_extra=ollama_body_doc(ShowRequest))
async def show(request: Request) -> Response:
    st = state_of(request)
    body: ShowRequest = parse_model(ShowRequest, (await json_body(request)).data)
    served_name(st, body.model)
    if st.host is not None:  # a model's facts without loading it: its template as the GGUF has it
        ref = st.host.names.resolve(untagged(st, body.model))
        live = [h.engine for h in st.host.resident() if h.ref.key == ref.key and h.engine is not None]
        st = st.view_of(ref, live[0] if live else None)
        if not live:
            return JSONResponse(await _cold_show(st))
    facts = await facts_of(st)
    info = template_info(st.engine)
    stops = info.stop if info is not None else ()
    path = st.model_path or st.model_id
    return JSONResponse({
        "license": facts["license"],
        "modelfile": f"# Modelfile generated by edge\nFROM {path}\n",
        "parameters": "\n".join(f'stop "{s}"' for s in stops),
        "template": info.text if info is not None else "",
        "details": facts["details"],
        "model_info": facts["model_info"],
        "capabilities": capabilities(st),
        "modified_at": facts["modified_at"],
    })


async def _cold_show(st: ApiState) -> dict[str, Any]:
    """/api/show of a model that is not resident, from its GGUF header alone."""
    facts = await facts_of(st)
    template = facts.get("template", "")
    caps = ["completion", *(["tools"] if "tools" in template else []), "embedding"]
    modelfile = f"# Modelfile generated by edge\nFROM {st.model_path}\n"
    return {"license": facts["license"], "modelfile": modelfile,
            "parameters": "", "template": template, "details": facts["details"],
            "model_info": facts["model_info"], "capabilities": caps, "modified_at": facts["modified_at"]}


# --- the store ------------------------------------------------------------------------------------


def _store_name(store: ModelStore, st: ApiState, name: str) -> str:
    ref = untagged(st, name)
    if ref not in store.catalog and store.path_of(ref) is None:
        raise ModelNotFound(name, f"not in edge's catalog ({', '.join(sorted(store.catalog))})")
    return ref


@router.post("/api/pull", openapi_extra=ollama_body_doc(PullRequest))
async def pull(request: Request) -> Response:
    st = state_of(request)
    body: PullRequest = parse_model(PullRequest, (await json_body(request)).data)
    store = store_for(st.settings)
    ref = _store_name(store, st, body.model)
    entry = store.catalog.get(ref)
    digest = f"sha256:{entry.sha256}" if entry is not None else ""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    def report(done: int, total: int | None) -> None:
        item = {"status": f"pulling {digest[7:19]}", "digest": digest, "total": total or 0, "completed": done}
        loop.call_soon_threadsafe(lines.put_nowait, item)

    failed: list[Exception] = []

    async def run() -> None:
        """The pull itself, in a worker thread; it finishes even when the client leaves."""
        try:
            await anyio.to_thread.run_sync(lambda: store.pull(ref, progress=report))
            for status in ("verifying sha256 digest", "writing manifest", "success"):
                lines.put_nowait({"status": status})
        except EdgeError as exc:
            failed.append(exc)
            lines.put_nowait(to_http(exc, "/api/")[1])
        except Exception as exc:  # a bug in the store: still one Ollama-shaped line, logged
            log.exception("pull %s failed", ref)
            failed.append(exc)
            lines.put_nowait(ollama_payload("internal server error"))
        finally:
            lines.put_nowait(None)

    task = asyncio.ensure_future(run())
    st.ollama_cache.setdefault("pulls", set()).add(task)  # keep a reference until it ends
    task.add_done_callback(st.ollama_cache["pulls"].discard)
    lines.put_nowait({"status": "pulling manifest"})
    if not body.stream:
        last: dict[str, Any] = {}
        while (item := await lines.get()) is not None:
            last = item
        if failed:
            raise failed[0]
        return JSONResponse(last)

    async def stream() -> Any:
        while (item := await lines.get()) is not None:
            yield ndjson_line(item)

    async def closed() -> None:
        return None

    return NdjsonStream(stream(), lambda: None, closed)


@router.delete("/api/delete", openapi_extra=ollama_body_doc(DeleteRequest))
async def delete(request: Request) -> Response:
    st = state_of(request)
    body: DeleteRequest = parse_model(DeleteRequest, (await json_body(request)).data)
    store = store_for(st.settings)
    ref = untagged(st, body.model)
    path = store.path_of(ref)
    if path is None:
        raise ModelNotFound(body.model, "not in the model store")
    if st.host is not None:  # a resident model is unloaded first; one with requests running stays
        key = st.resolve_name(ref)
        if not await anyio.to_thread.run_sync(st.host.unload_model, key):
            raise InvalidRequest(f"model {body.model!r} has requests running; retry when they end", "model")
    elif st.model_path is not None and os.path.realpath(path) == os.path.realpath(st.model_path):
        raise InvalidRequest(f"model {body.model!r} is the one this server serves; stop the server first",
                             "model")
    await anyio.to_thread.run_sync(store.remove, ref)
    return Response(status_code=200)
