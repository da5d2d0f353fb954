"""Model leases end with the request: a pure ASGI middleware gives back every lease a request
took (`ApiState.for_model`), after the last byte of a streamed answer, on an error, or when the
client went away while its model loaded. Leases are kept in the request's scope state."""

from __future__ import annotations

from typing import Any

LEASES_KEY = "edge_leases"


class LeaseMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        leases: list[Any] = []
        scope.setdefault("state", {})[LEASES_KEY] = leases
        try:
            await self.app(scope, receive, send)
        finally:
            for lease in leases:
                lease.release()


def lease_list(request: Any) -> list[Any]:
    """The request's list of leases (an empty throwaway one outside the middleware: tests)."""
    state = request.scope.setdefault("state", {})
    leases: list[Any] = state.setdefault(LEASES_KEY, [])
    return leases
