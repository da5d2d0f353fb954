"""The inference probe's results (`api/health_probe.py`), kept on the app state for /metrics,
the periodic prober and the systemd watchdog."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    model: str | None  # None: nothing resident, nothing probed
    latency_ms: float | None
    detail: str
    at_unix_s: float

    def to_json(self) -> dict[str, Any]:
        return {"status": "ok" if self.ok else "unavailable", "model": self.model,
                "latency_ms": None if self.latency_ms is None else round(self.latency_ms, 1),
                "detail": self.detail, "at_unix_s": round(self.at_unix_s, 3)}


@dataclass
class ProbeRecord:
    """The last probe and the counts, shared by the endpoint, the prober and /metrics."""

    last: ProbeResult | None = None
    runs: int = 0
    failures: int = 0

    def add(self, result: ProbeResult) -> ProbeResult:
        self.last, self.runs = result, self.runs + 1
        self.failures += 0 if result.ok else 1
        return result

    @property
    def passing(self) -> bool:
        return self.last is None or self.last.ok
