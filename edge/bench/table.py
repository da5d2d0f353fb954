"""The terminal table of a bench document (also used for report.md, as a Markdown table)."""

from __future__ import annotations

from typing import Any

from edge.bench.recommend import COLUMNS as SWEEP_COLUMNS
from edge.bench.recommend import recommendation_line
from edge.bench.recommend import rows as sweep_rows

COLUMNS = ("target", "C", "ok", "fail", "req/s", "tok/s", "TTFT p50/p90/p99 ms", "TPOT p50/p90 ms",
           "e2e p50/p90/p99 ms")


def _ms(p: dict[str, float | None], keys: tuple[str, ...]) -> str:
    return "/".join("-" if p.get(k) is None else f"{p[k] * 1000:.0f}" for k in keys)


def _fail(s: dict[str, Any]) -> str:
    if not s["n_failed"]:
        return "0"
    parts = [f"{code}:{n}" for code, n in s["failed_by_status"].items()]
    parts += [f"{name}:{s[key]}" for name, key in (("timeout", "n_timeouts"), ("conn", "n_transport_errors"),
                                                  ("stream", "n_stream_errors"), ("empty", "n_empty"))
              if s[key]]
    return f"{s['n_failed']} ({', '.join(parts)})"


def rows(doc: dict[str, Any]) -> list[tuple[str, ...]]:
    out = []
    for s in doc["steps"]:
        out.append((
            s["target"], str(s["concurrency"]), str(s["n_ok"]), _fail(s), f"{s['requests_per_s']:.2f}",
            f"{s['output_tokens_per_s']:.1f}", _ms(s["ttft_s"], ("p50", "p90", "p99")),
            _ms(s["tpot_s"], ("p50", "p90")), _ms(s["e2e_s"], ("p50", "p90", "p99")),
        ))
    return out


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def compare_rows(doc: dict[str, Any]) -> list[tuple[str, ...]]:
    return [(f"{c['target']}/{c['baseline']}", str(c["concurrency"]), _ratio(c["requests_per_s"]),
             _ratio(c["output_tokens_per_s"]), _ratio(c["ttft_s_p50"]), _ratio(c["ttft_s_p90"]),
             _ratio(c["e2e_s_p50"]), _ratio(c["e2e_s_p90"])) for c in doc["compare"]]


COMPARE_COLUMNS = ("ratio", "C", "req/s", "tok/s", "TTFT p50", "TTFT p90", "e2e p50", "e2e p90")


def _text(header: tuple[str, ...], body: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return [fmt.format(*header), *(fmt.format(*r) for r in body)]


def _markdown(header: tuple[str, ...], body: list[tuple[str, ...]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(r) + " |" for r in body)]


def knee_lines(doc: dict[str, Any]) -> list[str]:
    return [f"knee {label}: " + ("none (throughput kept rising, or latency held)" if c is None else f"C={c}")
            for label, c in doc["knee"].items()]


def sweep_lines(sweep: dict[str, Any], markdown: bool = False) -> list[str]:
    """The slots sweep: each setting's knee and best point within the target, then the recommendation."""
    fmt = _markdown if markdown else _text
    head = f"slots sweep, target P90 TTFT <= {sweep['target_p90_ttft_ms']:g} ms"
    rec = recommendation_line(sweep["recommendation"])
    return [head, *[""] * markdown, *fmt(SWEEP_COLUMNS, sweep_rows(sweep)), "",
            f"**{rec}**" if markdown else rec]


def render(doc: dict[str, Any], markdown: bool = False) -> str:
    """The figures table, the knee per target and, when comparing, the B/A ratios."""
    fmt = _markdown if markdown else _text
    bullet = "- " if markdown else ""
    lines = fmt(COLUMNS, rows(doc))
    lines += ["", *(bullet + k for k in knee_lines(doc))]
    if doc.get("sweep"):
        lines += ["", *sweep_lines(doc["sweep"], markdown)]
    if doc["compare"]:
        lines += ["", "ratios B/A (throughput above 1: B serves more; latency above 1: B is slower)"]
        lines += [""] * markdown + fmt(COMPARE_COLUMNS, compare_rows(doc))
    if doc["failed_requests"]:
        lines += ["", f"{doc['failed_requests']} requests failed (warmup included); first errors:"]
        seen: list[str] = []
        for s in doc["steps"]:
            seen += [e for e in s["errors_sample"] if e not in seen]
        lines += [""] * markdown + [f"{bullet or '  '}{e}" for e in seen[:5]]
    return "\n".join(lines)
