"""Engine speed from measured figures (configs/throughput/*.json, written by edge.tools.calibrate).

The harness and the simulated device never invent tokens/s: aggregate decode
speed for (sequences, threads) and prefill speed per thread count come from a
calibration file; values between measured points are interpolated linearly.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge.config import CONFIGS_DIR
from edge.errors import ConfigError

THROUGHPUT_DIR = CONFIGS_DIR / "throughput"
# The simulated devices are defined against a fixed reference table (see its "note"), so edge sim
# figures compare across sessions and machines; `--calibration cpu-2core-smollm2` (a live measurement
# of this machine class) or any file of `python -m edge.tools.calibrate` runs them on another.
DEFAULT_CALIBRATION = "sim-reference-2core-smollm2"


@dataclass(frozen=True)
class ThroughputModel:
    """Aggregate decode tokens/s by (threads, sequences), prefill tokens/s by threads."""

    decode_tps: dict[tuple[int, int], float]  # (threads, sequences) -> aggregate tokens/s
    prefill_tps: dict[int, float]  # threads -> prompt tokens/s
    source: str = ""
    _memo: dict[tuple[str, int, int, float], float] = field(default_factory=dict, compare=False, repr=False)

    @property
    def max_threads(self) -> int:
        return max(t for t, _ in self.decode_tps)

    @property
    def max_sequences(self) -> int:
        return max(s for _, s in self.decode_tps)

    def _threads_key(self, threads: int) -> int:
        known = sorted({t for t, _ in self.decode_tps})
        return min(known, key=lambda t: (abs(t - threads), t))

    def decode_tokens_per_s(self, sequences: int, threads: int) -> float:
        """Aggregate tokens/s over `sequences` decoding together at full clock and duty."""
        key = ("d", sequences, threads, 0.0)
        if key not in self._memo:
            self._memo[key] = self._decode(sequences, threads)
        return self._memo[key]

    def _decode(self, sequences: int, threads: int) -> float:
        if sequences <= 0:
            return 0.0
        t = self._threads_key(threads)
        points = sorted((s, v) for (tt, s), v in self.decode_tps.items() if tt == t)
        if sequences <= points[0][0]:
            return points[0][1] * sequences / points[0][0]
        for (s0, v0), (s1, v1) in itertools.pairwise(points):
            if s0 <= sequences <= s1:
                return v0 + (v1 - v0) * (sequences - s0) / (s1 - s0)
        return points[-1][1]  # batches beyond the measured range do not get faster

    def decode_table(self, max_sequences: int,
                     max_threads: int | None = None) -> tuple[tuple[int, int, float], ...]:
        """Dense (threads, sequences, tok/s) grid, the form the controller's ladder takes."""
        threads = range(1, (max_threads or self.max_threads) + 1)
        return tuple((t, s, round(self.decode_tokens_per_s(s, t), 2))
                     for t in threads for s in range(1, max_sequences + 1))

    def prefill_tokens_per_s(self, threads: int) -> float:
        known = sorted(self.prefill_tps)
        t = min(known, key=lambda k: (abs(k - threads), k))
        return self.prefill_tps[t]

    def utilisation(self, sequences: int, threads: int, duty: float, off_threads: int = 0) -> float:
        """Power share of a duty cycle: `duty` of the time at `threads`, the rest at `off_threads`."""
        key = ("u", sequences, threads, duty)
        if key not in self._memo:
            self._memo[key] = self._utilisation(sequences, threads, duty)
        on = self._memo[key]
        if off_threads <= 0 or duty >= 1.0:
            return on
        return on + (1.0 - duty) * self.utilisation(sequences, off_threads, 1.0)

    def _utilisation(self, sequences: int, threads: int, duty: float) -> float:
        """Fraction of the device's dynamic power drawn by this load, in [0, 1].

        Power follows busy cores (threads out of the calibrated maximum) times
        the fraction of wall time stepping (duty), and rises mildly with batch
        size because bigger batches do more arithmetic per weight fetched.
        """
        if sequences <= 0 or duty <= 0:
            return 0.0
        core_frac = min(1.0, threads / self.max_threads)
        speedup = self.decode_tokens_per_s(sequences, threads) / self.decode_tokens_per_s(1, threads)
        full = self.decode_tokens_per_s(self.max_sequences, threads) / self.decode_tokens_per_s(1, threads)
        batch_term = 0.7 + 0.3 * ((speedup - 1.0) / (full - 1.0) if full > 1.0 else 1.0)
        return max(0.0, min(1.0, duty * core_frac * batch_term))

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "") -> ThroughputModel:
        try:
            decode = {
                (int(r["threads"]), int(r["sequences"])): float(r["tokens_per_s"]) for r in data["decode"]
            }
            prefill = {int(r["threads"]): float(r["tokens_per_s"]) for r in data["prefill"]}
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError("throughput", f"{source}: malformed calibration file ({exc})") from exc
        if not decode or not prefill or min(decode.values()) <= 0 or min(prefill.values()) <= 0:
            raise ConfigError("throughput", f"{source}: needs positive decode and prefill figures")
        return cls(decode_tps=_envelope(decode), prefill_tps=prefill, source=source)


def _envelope(decode: dict[tuple[int, int], float]) -> dict[tuple[int, int], float]:
    """Upper monotone envelope: a bigger batch or more threads never decodes slower.

    Measured on a shared machine, a figure can only be too low (another process
    stole the CPU), so a dip below a smaller batch or fewer threads is noise.
    """
    out: dict[tuple[int, int], float] = {}
    for t, n in sorted(decode):
        below = [out[k] for k in ((t, n - 1), (t - 1, n)) if k in out]
        out[(t, n)] = max([decode[(t, n)], *below])
    return out


def load_throughput(name_or_path: str | Path = DEFAULT_CALIBRATION) -> ThroughputModel:
    """Load a calibration by name (configs/throughput/NAME.json) or by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = THROUGHPUT_DIR / f"{name_or_path}.json"
    if not path.is_file():
        raise ConfigError(
            "throughput", f"no calibration file {path}; run `python -m edge.tools.calibrate` to measure one"
        )
    return ThroughputModel.from_json(json.loads(path.read_text()), source=str(path))
