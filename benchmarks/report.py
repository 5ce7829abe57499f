"""The benchmark report: markdown tables and the scaling plot from the results' JSON files.

    python -m benchmarks.report [--results DIR]

Reads `DIR/grpo/*.json` (`benchmarks.bench_grpo`), `DIR/sampler_cpu.json`
(`benchmarks.bench_sampler`), `DIR/attention_cpu.json` (`benchmarks.bench_attention`),
`DIR/preference_cpu.json` (`benchmarks.bench_preference`), `DIR/trim_cpu.json`
(`benchmarks.bench_trim`) and `DIR/gpu/*.json`
(`benchmarks.bench_gpu`) when present, and writes `DIR/README.md` and `DIR/scaling.png` (log-log: seconds per step and the update step's
memory against the doubled quantity). Speed-ups compare medians measured in the same run; the FLOP/s
fractions divide the model's FLOPs (`benchmarks.workloads`) per second by the jax float32
matmul peak measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
from typing import Any

from benchmarks.workloads import WORKLOADS, Workload, iteration_flops

ROOT = pathlib.Path(__file__).resolve().parents[1]
AXES = {"width": "hidden_size", "length": "new_tokens", "group": "samples"}


def _load(directory: pathlib.Path) -> dict[str, dict]:
    if not directory.is_dir():
        return {}
    return {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


def _ok(result: dict | None) -> bool:
    return result is not None and "error" not in result


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.{digits}g}"


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if not a or not b else f"{b / a:.2f}×"


def _workloads(grpo: dict[str, dict]) -> list[Workload]:
    """The workloads with a result (file names `<part>__<model>__<B>x<G>x<T>`), in the order of
    `WORKLOADS`."""
    found = {}
    for name in grpo:
        if name.startswith(("ours_", "peer_")) and name.count("__") == 2:
            _, model, sizes = name.split("__")
            B, G, T = (int(v) for v in sizes.split("x"))
            w = Workload(model, B, G, T)
            found[w.name] = w
    order = {w.name: i for i, w in enumerate(WORKLOADS)}
    return sorted(found.values(), key=lambda w: (order.get(w.name, len(order)), w.name))


def _best(
    grpo: dict[str, dict], name: str, peer: str, variant: str, by: str = "seconds_per_step"
) -> dict | None:
    """The better (smaller `by`: seconds per step, or time to first step) of a peer's default
    run and its `variant` (TRL on one thread, Tunix with the huge-page tunable), marked with
    `variant` when that one won."""
    runs = [grpo.get(f"peer_{peer}__{name}"), grpo.get(f"peer_{peer}_{variant}__{name}")]
    ok = [(r, tag) for r, tag in zip(runs, (None, variant), strict=True) if _ok(r)]
    ok = [(r, tag) for r, tag in ok if r.get(by) is not None]
    if not ok:
        return None
    best, tag = min(ok, key=lambda p: p[0][by])
    return {**best, "variant": tag}


def _best_trl(grpo: dict[str, dict], name: str, by: str = "seconds_per_step") -> dict | None:
    return _best(grpo, name, "trl", "1thread", by)


def _best_tunix(grpo: dict[str, dict], name: str, by: str = "seconds_per_step") -> dict | None:
    return _best(grpo, name, "tunix", "hugepages", by)


def grpo_table(grpo: dict[str, dict]) -> list[str]:
    """Seconds per step and time to first step, ours against the peers."""
    rows = [
        "| workload | ours: loop | ours: compiled (K) | Tunix | TRL | loop vs faster peer | "
        "compiled vs faster peer |",
        "|---|---|---|---|---|---|---|",
    ]
    first = [
        "| workload | ours: loop | ours: loop, 2nd run | ours: compiled | ours: compiled, "
        "2nd run | Tunix | TRL |",
        "|---|---|---|---|---|---|---|",
    ]
    for w in _workloads(grpo):
        loop, comp = grpo.get(f"ours_loop__{w.name}"), grpo.get(f"ours_compiled__{w.name}")
        tunix, trl = _best_tunix(grpo, w.name), _best_trl(grpo, w.name)
        s = {
            k: r["seconds_per_step"] if _ok(r) else None
            for k, r in {"loop": loop, "comp": comp, "tunix": tunix, "trl": trl}.items()
        }
        peers = [v for v in (s["tunix"], s["trl"]) if v]
        fastest = min(peers) if peers else None
        k = comp.get("iterations_per_call") if _ok(comp) else None
        trl_note = f" ({trl['torch_threads']} thr)" if _ok(trl) else ""
        tunix_note = " (THP)" if _ok(tunix) and tunix["variant"] == "hugepages" else ""
        label = f"{w.model} {w.prompts}×{w.samples}×{w.new_tokens}"
        rows.append(
            f"| {label} | {_fmt(s['loop'])} | {_fmt(s['comp'])} ({k}) | {_fmt(s['tunix'])}{tunix_note} | "
            f"{_fmt(s['trl'])}{trl_note} | {_ratio(s['loop'], fastest)} | "
            f"{_ratio(s['comp'], fastest)} |"
        )

        def ttfs(r: dict | None, second: bool = False) -> str:
            if not _ok(r):
                return "—"
            if second:
                r = r.get("second_run") or {}
            t = r.get("time_to_first_step_s")
            c = r.get("compile_to_first_step") or {}
            if t is None:
                return "—"
            xla = c.get("compile_or_cache_load_s", c.get("xla_compile_s"))
            return f"{_fmt(t)} ({_fmt(xla)})" if xla is not None else _fmt(t)

        started = "time_to_first_step_s"  # a peer's faster start, from either of its runs
        first.append(
            f"| {label} | {ttfs(loop)} | {ttfs(loop, True)} | {ttfs(comp)} | "
            f"{ttfs(comp, True)} | {ttfs(_best_tunix(grpo, w.name, started))} | "
            f"{ttfs(_best_trl(grpo, w.name, started))} |"
        )
    return [
        "### GRPO iteration: seconds per step (median, steady state)",
        "",
        "Speed-up = the faster peer's seconds per step / ours. Ours run with glibc's huge-page "
        "tunable, as `jaxrl-llm` runs itself (`jaxrl_llm/hugepages.py`); Tunix is the faster of "
        "its run as installed and its run with the same tunable (marked THP); TRL the faster of "
        "torch on all cores and on one thread.",
        "",
        *rows,
        "",
        "### Time to first step (s, after the imports; in brackets: XLA compilation, or in the "
        "second run loading the executables from the persistent compilation cache; a peer's "
        "is the faster start of its two runs)",
        "",
        *first,
    ]


def _gflops(flops: int, r: dict | None, key: str = "seconds_per_step") -> float | None:
    """`flops` per second of `r[key]`, in GFLOP/s (None without a measurement)."""
    return flops / r[key] / 1e9 if r and r.get(key) else None


def flops_table(grpo: dict[str, dict]) -> list[str]:
    """Model FLOP/s of the iteration and of the update step alone against the matmul peak,
    from the measured seconds and `workloads.iteration_flops` (so a change of the FLOP model
    applies to every stored result alike)."""
    peak = grpo.get("matmul__jax")
    peak_g = peak["gflops_median"] if _ok(peak) else None
    torch_peak = grpo.get("matmul__torch")
    lines = [
        "### Model FLOP/s against the measured float32 matmul peak",
        "",
        f"Matmul peak (2048², median): jax {_fmt(peak_g)} GFLOP/s"
        + (f", torch {_fmt(torch_peak['gflops_median'])} GFLOP/s" if _ok(torch_peak) else "")
        + ". Model FLOPs (`benchmarks/workloads.py`) are the same count for every "
        "implementation: the forwards count each row's prompt, so an implementation that runs a "
        "group's shared prompt once (ours, `train.shared_prompt_forward`) executes fewer FLOPs "
        "than counted (small 8×8×64: 142 of 166 GFLOP; docs/performance.md) and its % of the "
        "peak on executed FLOPs is lower than shown.",
        "",
        "| workload | GFLOP / iteration | loop GFLOP/s (% peak) | compiled GFLOP/s (% peak) | "
        "Tunix GFLOP/s (% peak) | update alone s | update GFLOP/s (% peak) |",
        "|---|---|---|---|---|---|---|",
    ]

    def pct(g: float | None) -> str:
        if g is None:
            return "—"
        return f"{_fmt(g)} ({100 * g / peak_g:.0f}%)" if peak_g else _fmt(g)

    for w in _workloads(grpo):
        loop, comp = grpo.get(f"ours_loop__{w.name}"), grpo.get(f"ours_compiled__{w.name}")
        tunix = _best_tunix(grpo, w.name)
        update = loop.get("update") if _ok(loop) else None
        flops = iteration_flops(w)
        lines.append(
            f"| {w.model} {w.prompts}×{w.samples}×{w.new_tokens} | "
            f"{flops['iteration'] / 1e9:.3g} | "
            f"{pct(_gflops(flops['iteration'], loop) if _ok(loop) else None)} | "
            f"{pct(_gflops(flops['iteration'], comp) if _ok(comp) else None)} | "
            f"{pct(_gflops(flops['iteration'], tunix) if _ok(tunix) else None)} | "
            f"{_fmt(update['median_s'] if update else None)} | "
            f"{pct(_gflops(flops['update'], update, 'median_s'))} |"
        )
    return lines


def phases_table(grpo: dict[str, dict]) -> list[str]:
    """Where a step of the loop goes (medians of the loop's own per-phase timers)."""
    lines = [
        "### Where the step-by-step loop's time goes (median seconds per phase)",
        "",
        "| workload | sample | reward (host) | reference forward + advantages | update | step |",
        "|---|---|---|---|---|---|",
    ]
    for w in _workloads(grpo):
        loop = grpo.get(f"ours_loop__{w.name}")
        if not _ok(loop) or "phases_median_s" not in loop:
            continue
        p = loop["phases_median_s"]
        lines.append(
            f"| {w.model} {w.prompts}×{w.samples}×{w.new_tokens} | {_fmt(p.get('sample_s'))} | "
            f"{_fmt(p.get('reward_s'))} | {_fmt(p.get('forward_s'))} | "
            f"{_fmt(p.get('update_s'))} | {_fmt(loop['seconds_per_step'])} |"
        )
    return lines


def _scaling(grpo: dict[str, dict]) -> dict[str, list[tuple[float, dict]]]:
    out: dict[str, list[tuple[float, dict]]] = {}
    for name, r in grpo.items():
        if name.startswith("scaling_") and _ok(r):
            w = Workload(**r["workload"])
            x = w.shape.hidden_size if r["axis"] == "width" else getattr(w, AXES[r["axis"]])
            out.setdefault(r["axis"], []).append((x, r))
    return {axis: sorted(out[axis], key=lambda p: p[0]) for axis in AXES if axis in out}


def _slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of log(y) on log(x): the exponent of the power law."""
    pts = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None


def _update_memory(r: dict) -> float | None:
    """MB of the update step's arguments, outputs and temporaries (XLA's analysis)."""
    u = r.get("update") or {}
    parts = [u.get(f"xla_{k}_mb") for k in ("argument", "output", "temp")]
    return sum(parts) if all(p is not None for p in parts) else None


def scaling_table(grpo: dict[str, dict]) -> list[str]:
    sweeps = _scaling(grpo)
    if not sweeps:
        return []
    lines = [
        "### Scaling (step-by-step loop around tiny 8×8×64)",
        "",
        "Exponent = log-log slope of seconds per step against the doubled quantity (1 = linear).",
        "",
        "| doubled | value | s / step | update alone s | update memory MB (XLA) | peak RSS MB |",
        "|---|---|---|---|---|---|",
    ]
    for axis, points in sweeps.items():
        for x, r in points:
            u = r.get("update") or {}
            lines.append(
                f"| {axis} | {x} | {_fmt(r['seconds_per_step'])} | {_fmt(u.get('median_s'))} | "
                f"{_fmt(_update_memory(r))} | {_fmt(r.get('peak_rss_mb'))} |"
            )
        slope = _slope([(x, r["seconds_per_step"]) for x, r in points])
        update_slope = _slope([(x, (r.get("update") or {}).get("median_s")) for x, r in points])
        memory_slope = _slope([(x, _update_memory(r)) for x, r in points])
        lines.append(
            f"| {axis} | exponent | {_fmt(slope, 2)} | {_fmt(update_slope, 2)} | "
            f"{_fmt(memory_slope, 2)} | |"
        )
    return lines


def scaling_plot(grpo: dict[str, dict], path: pathlib.Path) -> bool:
    """Log-log plot of the sweeps; False when there is nothing to plot."""
    sweeps = _scaling(grpo)
    if not sweeps:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(sweeps), figsize=(4 * len(sweeps), 6.5), squeeze=False)
    for col, (axis, points) in enumerate(sweeps.items()):
        xs = [x for x, _ in points]
        for row, (label, get) in enumerate(
            [
                ("seconds / step", lambda r: r["seconds_per_step"]),
                ("update memory, XLA (MB)", _update_memory),
            ]
        ):
            ax = axes[row][col]
            ys = [get(r) for _, r in points]
            if not all(ys):
                ax.set_visible(False)
                continue
            ax.loglog(xs, ys, "o-", base=2, label="measured")
            if ys[0]:
                ax.loglog(xs, [ys[0] * x / xs[0] for x in xs], "--", base=2, label="linear")
            if row == 0:
                updates = [(r.get("update") or {}).get("median_s") for _, r in points]
                if all(updates):
                    ax.loglog(xs, updates, "s-", base=2, label="update alone")
            ax.set_xlabel({"width": "model width D", "length": "new tokens T", "group": "G"}[axis])
            ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle("GRPO step scaling (tiny 8×8×64 base, doubling one quantity)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def sampler_table(results: pathlib.Path) -> list[str]:
    path = results / "sampler_cpu.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    lines = [
        "### Sampler (generated tokens/s, `benchmarks/bench_sampler.py`)",
        "",
        "| model | B × G × T | ours tok/s | compile s | HF generate tok/s (best of threads) | "
        "ours / HF | Tunix tok/s | Tunix first call s | ours / Tunix |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in data["results"]:
        ours = row["jaxrl_llm"]
        hf = [v["tokens_per_s"] for k, v in row.items() if k.startswith("hf_generate")]
        best = max(hf) if hf else None
        tunix = row.get("tunix") if _ok(row.get("tunix")) else {}
        lines.append(
            f"| {row['model']} | {row['prompts']}×{row['samples']}×{row['new_tokens']} | "
            f"{ours['tokens_per_s']} | {ours['compile_s']} | {best or '—'} | "
            f"{_ratio(best, ours['tokens_per_s'])} | {tunix.get('tokens_per_s', '—')} | "
            f"{tunix.get('first_call_s', '—')} | "
            f"{_ratio(tunix.get('tokens_per_s'), ours['tokens_per_s'])} |"
        )
    return lines


def attention_table(results: pathlib.Path) -> list[str]:
    path = results / "attention_cpu.json"
    if not path.exists():
        return []
    rows = json.loads(path.read_text())["results"]
    whole = {(r["model"], r["completion_len"]): r for r in rows if r["attention_chunk"] is None}
    lines = [
        "### Attention in query blocks (`benchmarks/bench_attention.py`)",
        "",
        "Log-prob forward + backward of 8 prompts × 8 completions (each prompt once per group), "
        "XLA's temporaries and seconds per call, every query at once against blocks of C "
        "queries (`model.attention_chunk`).",
        "",
        "| model | T | C | temporaries MB | whole / blocks | seconds | speed vs whole |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = whole.get((r["model"], r["completion_len"]))
        chunk = r["attention_chunk"]
        lines.append(
            f"| {r['model']} | {r['completion_len']} | {chunk or 'whole'} | {r['temp_mb']} | "
            f"{_ratio(r['temp_mb'], base['temp_mb']) if base and chunk else '—'} | "
            f"{r['median_s']} | "
            f"{_ratio(r['median_s'], base['median_s']) if base and chunk else '—'} |"
        )
    return lines


def preference_table(results: pathlib.Path) -> list[str]:
    path = results / "preference_cpu.json"
    if not path.exists():
        return []
    rows = json.loads(path.read_text())["results"]
    lines = [
        "### Each pair's prompt once, and packed pairs (`benchmarks/bench_preference.py`)",
        "",
        "One offline DPO step (β = 0.1, AdamW: the update step and the reference forward) and "
        "one reward-model update (Bradley-Terry), chosen and rejected rows concatenated against "
        "each pair's prompt run once (`shared_prompt`); on pairs of uneven lengths "
        "(`dpo_uneven`), the shared prompt against packed pairs (`packing`). Median seconds per "
        "call in one process.",
        "",
        "| objective | model | pairs × P + T | forms | token slots | update s | reference s | "
        "update speed-up | reference speed-up | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base_form, form = r.get("forms", ("concatenated", "shared_prompt"))
        base, new = r[base_form], r[form]
        reference = (
            f"{base['reference_s']} → {new['reference_s']}" if "reference_s" in base else "—"
        )
        lines.append(
            f"| {r.get('objective', 'dpo')} | {r['model']} | {r['pairs']} × {r['prompt_len']} + "
            f"{r['completion_len']} | {base_form} → {form} | "
            f"{r['token_rows'][base_form]} → {r['token_rows'][form]} | "
            f"{base['update_s']} → {new['update_s']} | {reference} | "
            f"{r['update_speedup']}× | "
            f"{str(r['reference_speedup']) + '×' if 'reference_speedup' in r else '—'} | "
            f"{base['compile_s']} → {new['compile_s']} |"
        )
    return lines


def trim_table(results: pathlib.Path) -> list[str]:
    path = results / "trim_cpu.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    rows = data["results"]
    lines = [
        "### Completions cut to the batch's longest, groups packed (`benchmarks/bench_trim.py`)",
        "",
        *([_machine_line(data["machine"]), ""] if "machine" in data else []),
        "The step-by-step GRPO loop at the full `max_new_tokens` width, with "
        "`train.trim_completions` (the batch's longest completion, bucketed) and with "
        "`train.pack_groups` too (each prompt once, its completions back to back in shared "
        "rows that read it); a tenth of the byte ids stop a row (rows stop after ≈ 10 "
        "tokens); with 2 minibatches, shuffled minibatches of whole prompts; the runs' steps "
        "alternate in one process. Median seconds per step after the warm-up; speed-ups over "
        "the workload's first form.",
        "",
        "| workload | form | widths | step s | sample s | forwards s | update s | "
        "step speed-up | update speed-up |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for form in ("full", "trimmed", "packed"):
            if form not in r:
                continue
            f = r[form]
            times = " | ".join(
                _fmt(f[k])
                for k in ("time/step_s", "time/sample_s", "time/forward_s", "time/update_s")
            )
            speedups = (
                f"{r[f'speedup_{form}_step']:.2f}× | {r[f'speedup_{form}_update']:.2f}×"
                if f"speedup_{form}_step" in r
                else "— | —"
            )
            lines.append(f"| {r['workload']} | {form} | {f['widths']} | {times} | {speedups} |")
    return lines


def pack_forms_table(results: pathlib.Path) -> list[str]:
    path = results / "pack_forms_cpu.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    lines = [
        "### One batch padded and packed (`benchmarks/bench_pack_forms.py`)",
        "",
        *([_machine_line(data["machine"]), ""] if "machine" in data else []),
        "The update step and the policy's log-prob forward of one captured GRPO batch (cut to "
        "its longest completion), the forms' calls alternating on the same batch and state: "
        "padded (in the CPU's row groups), packed as one call, and packed in as many parts as "
        "row groups (what the loop runs). Median seconds; speed-ups over the padded form.",
        "",
        "| workload | width | padding | slots saved | padded update / forward s | "
        "packed, one call | "
        "packed, in row groups | update speed-up (one call, row groups) | "
        "forward speed-up (one call, row groups) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["results"]:
        saved = f"{r['slot_saving']:.0%}" if "slot_saving" in r else "—"
        forms = " | ".join(
            f"{_fmt(r[f]['update'])} / {_fmt(r[f]['forward'])}"
            for f in ("padded", "packed_one_call", "packed")
        )
        speedups = " | ".join(
            f"{r[f'speedup_packed_one_call_{phase}']:.2f}×, {r[f'speedup_packed_{phase}']:.2f}×"
            for phase in ("update", "forward")
        )
        lines.append(
            f"| {r['workload']} | {r['width']} | {r['padding_share']:.0%} | {saved} | {forms} | "
            f"{speedups} |"
        )
    return lines


def _gpu_failed_row(part: str, d: dict) -> str:
    shape = ", ".join(f"{k} {v}" for k, v in d.items() if k != "error")
    return f"| {part}, {shape} | failed: {d['error']} | — | — | — |"


def _gpu_decode_row(d: dict) -> str:
    if "error" in d:
        return _gpu_failed_row("decode", d)
    shape = ", ".join(
        f"{k} {d[k]}"
        for k in ("layer_unroll", "steps_per_loop", "unroll_loop_steps", "decode_phases")
        if k in d
    )
    frac, measured = d.get("fraction_of_roofline"), d.get("fraction_of_measured_roofline")
    return (
        f"| decode, batch {d['batch']}{', ' + shape if shape else ' (default loop)'} | "
        f"{_fmt(d.get('tokens_per_s'))} tok/s ({_fmt(d.get('ms_per_decode_step'))} ms/step) | "
        f"{'—' if frac is None else f'{100 * frac:.1f}%'} | "
        f"{'—' if measured is None else f'{100 * measured:.1f}%'} | "
        f"{d.get('compile_short_s')} + {d.get('compile_long_s')} s |"
    )


def _gpu_update_row(u: dict) -> str:
    if "error" in u:
        return _gpu_failed_row("update", u)
    measured = u.get("mfu_of_measured_peak")
    return (
        f"| update, {u['rows']} × {u['seq']} tokens, remat {u.get('remat', 'dots')}"
        f"{', fused attention' if u.get('fused_attention') else ''}"
        f"{f', log-probs in chunks of {c} positions per row' if (c := u.get('chunk_size')) else ''} | "
        f"{_fmt(u['median_s'])} s ({_fmt(u['achieved_flops'] / 1e12)} TFLOP/s) | "
        f"{100 * u['mfu']:.1f}% | {'—' if measured is None else f'{100 * measured:.1f}%'} | "
        f"{u['compile_s']} s |"
    )


def _peak_flops(r: dict) -> float:
    """The dense bf16 rate a GPU run reported against (runs before it was recorded at the top
    level carry it in their update part; the oldest assumed an H100 SXM's)."""
    return r.get("peak_flops") or r.get("update", {}).get("peak_flops", 989e12)


def gpu_table(results: pathlib.Path) -> list[str]:
    """One table per GPU run: decode against the HBM roofline, the update's bf16 MFU, both
    against the datasheet rates and against the card's rates measured in the same run."""
    runs = _load(results / "gpu")
    lines = []
    parts = ("decode", "update", "decode_variants", "update_variants")
    for name, r in runs.items():
        if not any(part in r for part in parts):  # a run of the ceilings alone
            continue
        c = r.get("ceilings", {})
        measured = (
            f" Measured in the run: {_fmt(c['bandwidth'] / 1e12)} TB/s (bf16 elementwise pass) "
            f"and {_fmt(c['bf16_matmul_flops'] / 1e12)} TFLOP/s (bf16 {c['matmul_n']}³ matmul)."
            if c
            else ""
        )
        lines += [
            f"### GPU (`benchmarks/bench_gpu.py`): {name}",
            "",
            f"{r.get('device', '?')}, jax {r.get('jax', '?')}; datasheet "
            f"({r.get('rates', 'H100 SXM')}) {_fmt(r['bandwidth'] / 1e12)} TB/s HBM and "
            f"{_fmt(_peak_flops(r) / 1e12)} TFLOP/s dense bf16."
            + measured
            + (f" `XLA_FLAGS={r['xla_flags']}`." if r.get("xla_flags") else ""),
            "",
            "| part | time | of datasheet roofline / peak | of measured | compile |",
            "|---|---|---|---|---|",
        ]
        lines += [_gpu_decode_row(d) for d in ([r["decode"]] if "decode" in r else [])]
        lines += [_gpu_decode_row(d) for d in r.get("decode_variants", [])]
        lines += [_gpu_update_row(u) for u in ([r["update"]] if "update" in r else [])]
        lines += [_gpu_update_row(u) for u in r.get("update_variants", [])]
        lines.append("")
    return lines


def _machine(grpo_dir: pathlib.Path) -> str:
    path = grpo_dir / "machine.json"
    if not path.exists():
        return ""
    return _machine_line(json.loads(path.read_text()))


def _machine_line(m: dict) -> str:
    return f"Machine: {m.get('cpu', '?')}, {m.get('cpu_count')} cores, {m.get('platform')}."


def _loads(grpo: dict[str, dict]) -> str:
    loads = []
    for r in grpo.values():
        value = r.get("load_avg_1min")
        loads += value if isinstance(value, list) else [value] if value is not None else []
    if not loads:
        return ""
    return f"1-minute load average during the run: {min(loads)}–{max(loads)}."


def write_report(results: pathlib.Path, command: str) -> pathlib.Path:
    """Write `results/README.md` (and `results/scaling.png`); returns the README's path."""
    grpo = _load(results / "grpo")
    plot = results / "scaling.png"
    plotted = scaling_plot(grpo, plot)
    about = " ".join(x for x in (_machine(results / "grpo"), _loads(grpo)) if x)
    sections: list[list[str]] = [
        [
            "# Benchmark results",
            "",
            f"Reproduce: `{command}` (see docs/performance.md). Never part of the test suite.",
            *(["", about] if about else []),
        ],
        grpo_table(grpo) if grpo else [],
        flops_table(grpo) if grpo else [],
        phases_table(grpo) if grpo else [],
        scaling_table(grpo),
        [f"![scaling]({plot.name})"] if plotted else [],
        sampler_table(results),
        attention_table(results),
        preference_table(results),
        trim_table(results),
        pack_forms_table(results),
        gpu_table(results),
    ]
    text = "\n\n".join("\n".join(s) for s in sections if s) + "\n"
    path = results / "README.md"
    path.write_text(text)
    return path


def main(argv: list[str] | None = None) -> Any:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--command", default="python -m benchmarks.run_all")
    args = parser.parse_args(argv)
    path = write_report(pathlib.Path(args.results), args.command)
    print(f"report: {path}")
    return path


if __name__ == "__main__":
    main()
