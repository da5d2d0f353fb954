"""macOS telemetry without root: OS pressure levels instead of temperatures.

macOS exposes no temperatures to an unprivileged process, but it publishes a
thermal pressure level (notify key `com.apple.system.thermalpressurelevel`,
0 nominal .. 4 sleeping) and a VM pressure level (`kern.memorystatus_vm_pressure_level`:
1 normal, 2 warn, 4 critical). We poll both: `NSProcessInfo.thermalState` lags
and its notifications are reported unreliable. The native layer is injected so
Linux CI tests the mapping with a fake; the ctypes layer is built only on darwin.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable
from typing import Any, Protocol

from edge.clock import Clock, SystemClock
from edge.telemetry.cpu import PsutilCpuReader
from edge.telemetry.powermode import MacPower, Runner, read_mac_power, run_command
from edge.telemetry.sample import PressureLevel, Sample

THERMAL_PRESSURE_KEY = b"com.apple.system.thermalpressurelevel"
VM_PRESSURE_SYSCTL = b"kern.memorystatus_vm_pressure_level"
_VM_LEVELS = {1: PressureLevel.NOMINAL, 2: PressureLevel.MODERATE, 4: PressureLevel.CRITICAL}


class NativeLayer(Protocol):
    """The two OS calls this source needs; each raises OSError when the OS refuses."""

    def thermal_pressure_level(self) -> int: ...

    def vm_pressure_level(self) -> int: ...


class DarwinNative:
    """libSystem through ctypes: notify(3) for thermal pressure, sysctlbyname(3) for VM pressure."""

    def __init__(self) -> None:
        if sys.platform != "darwin":
            raise OSError("the macOS native layer only works on darwin")
        path = ctypes.util.find_library("System") or "/usr/lib/libSystem.B.dylib"
        self._lib = ctypes.CDLL(path, use_errno=True)
        self._lib.notify_register_check.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)]
        self._lib.notify_register_check.restype = ctypes.c_uint32
        self._lib.notify_get_state.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]
        self._lib.notify_get_state.restype = ctypes.c_uint32
        self._lib.sysctlbyname.argtypes = [
            ctypes.c_char_p,
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_void_p,
            ctypes.c_size_t,
        ]
        self._lib.sysctlbyname.restype = ctypes.c_int
        self._token: int | None = None

    def thermal_pressure_level(self) -> int:
        if self._token is None:
            token = ctypes.c_int(0)
            status = self._lib.notify_register_check(THERMAL_PRESSURE_KEY, ctypes.byref(token))
            if status != 0:  # NOTIFY_STATUS_OK
                raise OSError(f"notify_register_check failed with status {status}")
            self._token = token.value
        state = ctypes.c_uint64(0)
        status = self._lib.notify_get_state(self._token, ctypes.byref(state))
        if status != 0:
            raise OSError(f"notify_get_state failed with status {status}")
        return int(state.value)

    def vm_pressure_level(self) -> int:
        value = ctypes.c_int(0)
        size = ctypes.c_size_t(ctypes.sizeof(value))
        if self._lib.sysctlbyname(VM_PRESSURE_SYSCTL, ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"sysctlbyname({VM_PRESSURE_SYSCTL.decode()}) failed")
        return int(value.value)


def _psutil_memory() -> Any:
    import psutil

    return psutil.virtual_memory()


class MacOSSource:
    """Thermal and memory pressure levels plus psutil memory, each read on its own."""

    name = "macos"

    def __init__(
        self,
        native: NativeLayer | None = None,
        clock: Clock | None = None,
        virtual_memory: Callable[[], Any] = _psutil_memory,
        cpu: PsutilCpuReader | None = None,
        runner: Runner = run_command,
        use_powermetrics: bool = False,
        power_period_s: float = 10.0,
    ) -> None:
        self._native = native
        # `pmset -g batt` (and, as root, `powermetrics`) run at most every `power_period_s`
        self.runner = runner
        self.use_powermetrics = use_powermetrics
        self.power_period_s = power_period_s
        self._power: MacPower | None = None
        self._power_t_s: float | None = None
        self.cpu = cpu or PsutilCpuReader()
        self.clock = clock or SystemClock()
        self.virtual_memory = virtual_memory
        self._native_error: str | None = None

    def _layer(self) -> NativeLayer | None:
        if self._native is None and self._native_error is None:
            try:
                self._native = DarwinNative()
            except OSError as exc:
                self._native_error = f"native layer unavailable: {exc}"
        return self._native

    def read(self) -> Sample:
        t_s = self.clock.monotonic()
        errors: list[str] = []
        thermal: PressureLevel | None = None
        vm: PressureLevel | None = None
        native = self._layer()
        if native is None:
            errors.append(self._native_error or "native layer unavailable")
        else:
            try:
                raw = native.thermal_pressure_level()
                if 0 <= raw <= int(PressureLevel.SLEEPING):
                    thermal = PressureLevel(raw)
                else:
                    errors.append(f"thermal pressure level out of range: {raw}")
            except OSError as exc:
                errors.append(f"thermal pressure: {exc}")
            try:
                raw = native.vm_pressure_level()
                vm = _VM_LEVELS.get(raw)
                if vm is None:
                    errors.append(f"vm pressure level unknown: {raw}")
            except OSError as exc:
                errors.append(f"vm pressure: {exc}")
        total: int | None = None
        available: int | None = None
        try:
            mem = self.virtual_memory()
            total, available = int(mem.total), int(mem.available)
        except Exception as exc:  # psutil raises its own types on odd systems
            errors.append(f"memory: {type(exc).__name__}: {exc}")
        cpu: dict[str, Any] = {}
        try:
            cpu = self.cpu.read(t_s)
        except Exception as exc:
            errors.append(f"cpu: {type(exc).__name__}: {exc}")
        if self._power_t_s is None or t_s - self._power_t_s >= self.power_period_s:
            self._power_t_s = t_s
            self._power, notes = read_mac_power(self.runner, self.use_powermetrics)
            errors.extend(notes)
        pw = self._power or MacPower(None, None)
        return Sample(
            t_s=t_s,
            source=self.name,
            on_battery=pw.on_battery,
            battery_pct=pw.battery_pct,
            power_w=pw.power_w,
            power_source="powermetrics" if pw.power_w is not None else None,
            thermal_pressure=thermal,
            memory_pressure=vm,
            mem_total_bytes=total,
            mem_available_bytes=available,
            errors=tuple(errors),
            **cpu,
        )

    def close(self) -> None:
        """The notify token lives as long as the process; nothing to release."""
