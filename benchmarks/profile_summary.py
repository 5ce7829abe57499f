"""Summarise a `jax.profiler` trace where it was taken: where the device time of a call went.

    summary = profile(lambda: step(state, batch), device_prefix="/device:GPU")

Traces the call, reads the trace's XSpace with `jax.profiler.ProfileData` (no TensorBoard
needed) and returns, for every timeline ("line") of the matching planes (on a GPU: one per
CUDA stream, plus XLA's "XLA Modules" and "XLA Ops" lines):

- `events`, `busy_ms` (the sum of the events' durations), `span_ms` (first start to last end);
- `top`: the `top` event names with the largest total time, with counts and milliseconds.

On a GPU the kernel lines' `busy_ms` against the span (and the call's wall time) says whether
the device was kept busy or waited for the host (launch-bound), and `top` says which kernels to
look at first. With no matching plane (a CPU run) the host's XLA threads are summarised instead.
"""

from __future__ import annotations

import collections
import glob
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax


def summarise(path: str, device_prefix: str = "/device:", top: int = 12) -> dict[str, Any]:
    """Per-line totals and top events of the planes whose name starts with `device_prefix`."""
    data = jax.profiler.ProfileData.from_file(path)
    planes = [p for p in data.planes if p.name.startswith(device_prefix)]
    if not planes:
        planes = [p for p in data.planes if p.name.startswith("/host:CPU")]
    lines: dict[str, Any] = {}
    for plane in planes:
        for line in plane.lines:
            totals: collections.Counter[str] = collections.Counter()
            counts: collections.Counter[str] = collections.Counter()
            first, last, busy, n = float("inf"), 0.0, 0.0, 0
            for event in line.events:
                totals[event.name] += event.duration_ns
                counts[event.name] += 1
                busy += event.duration_ns
                first, last = min(first, event.start_ns), max(last, event.end_ns)
                n += 1
            if not n:
                continue
            lines[f"{plane.name} | {line.name}"] = {
                "events": n,
                "busy_ms": round(busy / 1e6, 3),
                "span_ms": round((last - first) / 1e6, 3),
                "top": [
                    {"name": name[:120], "count": counts[name], "ms": round(ns / 1e6, 3)}
                    for name, ns in totals.most_common(top)
                ],
            }
    return lines


def profile(call: Callable[[], Any], device_prefix: str = "/device:", top: int = 12) -> dict:
    """Trace one `call()` (already compiled and warm) and summarise it (module docstring)."""
    directory = tempfile.mkdtemp(prefix="jaxrl_llm_trace_")
    with jax.profiler.trace(directory):
        started = time.perf_counter()
        jax.block_until_ready(call())
        wall = time.perf_counter() - started
    (path,) = glob.glob(f"{directory}/**/*.xplane.pb", recursive=True)
    return {"wall_ms": round(1e3 * wall, 3), "lines": summarise(path, device_prefix, top)}


def brief(summary: dict[str, Any], lines: int = 4, names: int = 8) -> str:
    """A few text lines: the busiest timelines and their top events."""
    ranked = sorted(summary["lines"].items(), key=lambda kv: -kv[1]["busy_ms"])[:lines]
    out = [f"traced wall {summary['wall_ms']} ms"]
    for name, line in ranked:
        out.append(
            f"  {name}: {line['events']} events, busy {line['busy_ms']} ms of span "
            f"{line['span_ms']} ms"
        )
        out += [f"    {e['ms']:9.3f} ms {e['count']:6d}x {e['name']}" for e in line["top"][:names]]
    return "\n".join(out)
