"""API fuzz test: schemathesis generates requests from the app's own /openapi.json (every
operation, valid and invalid bodies) and sends them in-process (ASGI) to an app around the
scripted engine. No response may be a 5xx, and every 4xx must be a JSON error in the route's own
shape: OpenAI's `{"error": {"message", "type", "param", "code"}}`, or Ollama's `{"error": "..."}`
under /api/. At least `MIN_CASES` cases run in all; the budgets below keep it near 40 s on 2 cores.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.generation import GenerationMode

from tests.fakes import ScriptedEngine, make_app

MIN_CASES = 1000
MODEL = "scripted-model"
# examples per operation and mode (generating a chat body is ~10x dearer than a path parameter)
BUDGET: dict[str, int] = {"post /v1/chat/completions": 20, "post /v1/completions": 80,
                          "post /v1/responses": 70, "post /v1/embeddings": 90}
PATH_PARAM_BUDGET = 200  # GET/DELETE with a path parameter (positive only: any string is valid)
OTHER_BUDGET = 5  # operations with nothing to vary (GET /health, ...): hypothesis stops early


def error_shape_problem(path: str, status: int, body: Any) -> str | None:
    """Why `body` is not the error shape of the API `path` belongs to (None: it is)."""
    if not isinstance(body, dict) or "error" not in body:
        return "no top-level 'error'"
    err = body["error"]
    if path.startswith("/api/"):  # Ollama's native API
        return None if isinstance(err, str) and err else "Ollama errors are {'error': 'text'}"
    if not isinstance(err, dict):
        return "OpenAI errors are {'error': {...}}"
    if not (isinstance(err.get("message"), str) and err["message"] and isinstance(err.get("type"), str)):
        return "error.message and error.type must be non-empty strings"
    for key in ("param", "code"):
        if key not in err or not (err[key] is None or isinstance(err[key], str)):
            return f"error.{key} must be present, a string or null"
    return None


def test_error_shape_check_itself() -> None:
    ok = {"error": {"message": "m", "type": "invalid_request_error", "param": None, "code": "x"}}
    assert error_shape_problem("/v1/chat/completions", 400, ok) is None
    assert error_shape_problem("/v1/chat/completions", 400, {"error": "text"}) is not None
    assert error_shape_problem("/v1/models", 404, {"detail": "Not Found"}) is not None
    assert error_shape_problem("/api/chat", 400, {"error": "model is required"}) is None
    assert error_shape_problem("/api/chat", 400, ok) is not None


def _fuzz(op: Any, mode: GenerationMode, budget: int, key: str, seen: dict[str, int],
          failures: list[str]) -> None:
    @given(case=op.as_strategy(generation_mode=mode))
    @settings(max_examples=budget, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        seen[key] = seen.get(key, 0) + 1
        if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
            case.body["model"] = MODEL  # a random name stops at the model check: go deeper than a 404
        response = case.call()
        where = f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}"
        if response.status_code >= 500:
            failures.append(f"5xx: {where}")
        elif response.status_code >= 400:
            ctype = response.headers.get("content-type", [""])
            ctype = ctype[0] if isinstance(ctype, list) else ctype
            if not ctype.startswith("application/json"):
                failures.append(f"non-JSON {ctype!r} error: {where}")
            else:
                problem = error_shape_problem(case.formatted_path, response.status_code, response.json())
                if problem:
                    failures.append(f"{problem}: {where}")

    run()


@pytest.fixture(scope="module")
def schema() -> Any:
    app, _ = make_app(ScriptedEngine(n_ctx=256, n_slots=4), max_queue=1000)
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def test_fuzz_every_operation_no_5xx_and_errors_in_the_route_shape(schema: Any) -> None:
    ops = [result.ok() for result in schema.get_all_operations()]
    paths = {op.path for op in ops}
    assert {"/v1/chat/completions", "/v1/responses", "/v1/responses/{response_id}"} <= paths
    seen: dict[str, int] = {}
    failures: list[str] = []

    for op in ops:
        key = f"{op.method.lower()} {op.path}"
        t0 = time.perf_counter()
        has_body = op.body is not None and len(op.body) > 0
        modes = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE] if has_body else [GenerationMode.POSITIVE]
        budget = BUDGET.get(key, PATH_PARAM_BUDGET if "{" in op.path else OTHER_BUDGET)
        for mode in modes:
            _fuzz(op, mode, budget, key, seen, failures)
        print(f"{key}: {seen.get(key, 0)} cases, {time.perf_counter() - t0:.1f} s")
    total = sum(seen.values())
    assert not failures, f"{len(failures)} bad responses of {total}:\n" + "\n".join(failures[:20])
    assert total >= MIN_CASES, seen
