"""Per-model metrics of the model host, read at scrape time: state, planned bytes, requests,
waits for a load, last use, loads; and the budget against what the resident models hold."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from edge.host.models import ModelHost
from edge.host.residency import ModelState


class HostCollector(Collector):
    def __init__(self, host: ModelHost) -> None:
        self.host = host

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        rows = self.host.status()
        state = GaugeMetricFamily("edge_model_state", "1 for the state each hosted model is in",
                                  labels=["model", "state"])
        gauges = {
            "planned_bytes": GaugeMetricFamily("edge_model_planned_bytes",
                                               "Memory a hosted model holds when resident, as planned",
                                               labels=["model"]),
            "requests": GaugeMetricFamily("edge_model_requests", "Requests running or queued on the model",
                                          labels=["model"]),
            "waiting_for_load": GaugeMetricFamily("edge_model_waiting_for_load",
                                                  "Requests waiting for the model to load", labels=["model"]),
        }
        idle = GaugeMetricFamily("edge_model_idle_seconds", "Seconds since the model was last used",
                                 labels=["model"])
        loads = CounterMetricFamily("edge_model_loads", "Loads of the model since start", labels=["model"])
        for row in rows:
            for s in ModelState:
                state.add_metric([row["model"], s.value], 1.0 if row["state"] == s.value else 0.0)
            for key, fam in gauges.items():
                fam.add_metric([row["model"]], float(row[key]))
            if row["last_used_s_ago"] is not None:
                idle.add_metric([row["model"]], float(row["last_used_s_ago"]))
            loads.add_metric([row["model"]], float(row["loads"]))
        yield state
        yield from gauges.values()
        yield idle
        yield loads
        yield GaugeMetricFamily("edge_host_memory_budget_bytes", "What the resident models may hold together",
                                value=float(self.host.budget_bytes))
        yield GaugeMetricFamily("edge_host_resident_bytes", "What the resident and loading models hold",
                                value=float(self.host.held_bytes()))
