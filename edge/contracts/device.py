"""Facts about a class of device (configs/devices/*.toml), as telemetry, the scheduler and the
simulator read them.

A leaf module (imports nothing of edge's): the settings layer loads profiles, and the layers
below it name the type without importing the settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class DeviceProfile:
    """Facts about a class of device used when the device itself does not tell."""

    name: str
    description: str
    unified_memory: bool
    memory_reserve_bytes: int
    gpu_layers: int | Literal["auto"]
    thermal_limit_c: float  # passive trip used when no trip point is exposed
    thermal_critical_c: float
    default_threads: int | None = None  # None: physical CPU count
    # Simulated-device parameters (first-order RC); also sizes the thermal model.
    ambient_c: float = 25.0
    idle_power_w: float = 5.0
    max_power_w: float = 15.0
    thermal_resistance_c_per_w: float = 4.0
    thermal_tau_s: float = 60.0
    # Power budgets held by the scheduler (None: none): on mains, and on battery.
    power_budget_w: float | None = None
    battery_power_budget_w: float | None = None
