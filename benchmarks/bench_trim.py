"""The RL loop's step with completions cut to the batch's longest (`train.trim_completions`,
`jaxrl_llm.runner.completion_width`), and with its groups packed without padding
(`train.pack_groups`, `jaxrl_llm.runner.packed_groups`), against the full `max_new_tokens`
width.

Run with `python -m benchmarks.bench_trim [--out FILE.json] [--steps 8] [--quick]`.
Never part of the test suite's pass/fail.

The workload is the GRPO run of `benchmarks.bench_grpo` (`grpo_worker.run_config`: the
arithmetic task, β = 0.04, ε = 0.2, AdamW 1e-3) on the small model, 8 prompts × 8 samples with
a budget of 256 new tokens, and a tenth of the byte ids as stop tokens, so that completions
stop after ≈ 10 tokens on average and the longest of the 64 rows after ≈ 40-60: the shape of
a run whose budget is generous for what the policy writes. Three runs — full, trimmed, and
trimmed with packed groups — are prepared in one process and their steps alternate
(`runner.loop._rl_step`, the same keys); the first `--warmup` steps of each (compilation, one
per shape met) are left out, and the table reports the medians of the rest: the step, its
sampling, its forwards (reference log-probs and advantages) and its update. The runs start
from the same rollout, but the forms' float rounding makes their policies sample different
tokens within a few steps, so their later batches (and widths) differ: a comparison of whole
runs, noisy where the forms are close (on the same machine two runs of this benchmark gave
the packed step 2.0× and 1.48× the trimmed one). `benchmarks.bench_pack_forms` compares the
forms on one batch.

`--minibatches M` splits each update into `M` shuffled minibatches of whole prompts
(`algorithm.minibatch_unit: prompt`, PPO-style reuse with the old-policy forward): packed,
each minibatch's groups fill their own rows, one packing per epoch. `--forms` picks the runs
(default all three); speed-ups are over the first one measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
from typing import Any

from benchmarks.grpo_worker import run_config
from benchmarks.workloads import Workload, load_average, write_results

WORKLOADS = [Workload("small", 8, 8, 256)]
QUICK = [Workload("tiny", 2, 4, 64)]
STOP_EVERY = 10  # every tenth byte id stops a row
KEYS = ("time/step_s", "time/sample_s", "time/forward_s", "time/update_s", "perf/completion_width")
FORMS = {"full": (False, False), "trimmed": (True, False), "packed": (True, True)}


def _prepare(
    w: Workload,
    trim: bool,
    pack: bool,
    run_dir: str,
    minibatches: int = 1,
    *,
    stop_every: int = STOP_EVERY,
    row_groups: int | None = None,
    algorithm: Any = None,
):
    from jaxrl_llm.runner import prepare_run

    config = run_config(w, run_dir, None, None)
    stops = tuple(range(0, 256, stop_every))
    config = dataclasses.replace(
        config,
        sampling=dataclasses.replace(config.sampling, stop_tokens=stops, row_groups=row_groups),
        train=dataclasses.replace(config.train, trim_completions=trim, pack_groups=pack),
        algorithm=dataclasses.replace(
            algorithm or config.algorithm,
            minibatches=minibatches,
            minibatch_unit="row" if minibatches == 1 else "prompt",
        ),
    )
    prepared = prepare_run(config)
    prepared.checkpointer.close()
    return prepared


def measure(
    w: Workload, steps: int, warmup: int, forms: tuple[str, ...] = tuple(FORMS), minibatches=1
) -> dict:
    """Median phase times of the full, trimmed and packed runs (module docstring)."""
    from jaxrl_llm.runner import loop

    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for form in forms:
            trim, pack = FORMS[form]
            p = _prepare(w, trim, pack, f"{tmp}/{form}", minibatches)
            runs[form] = [p.context, p.state, p.data, []]
        for step in range(1, warmup + steps + 1):
            for form in forms:
                ctx, state, data, history = runs[form]
                state, data, metrics = loop._rl_step(ctx, state, data, step)
                runs[form][1:3] = state, data
                if step > warmup:
                    history.append({k: metrics[k] for k in KEYS if k in metrics})
                    history[-1]["slots"] = metrics.get("perf/packed_rows", 0.0)
    name = w.name if minibatches == 1 else f"{w.name}, {minibatches} minibatches"
    row = {"workload": name, "steps": steps, "load_before": load_average()}
    row["baseline"] = forms[0]
    for form in forms:
        history = runs[form][3]
        row[form] = {k: statistics.median(h[k] for h in history) for k in KEYS}
        row[form]["widths"] = sorted({int(h["perf/completion_width"]) for h in history})
        if form == "packed":
            row[form]["rows"] = sorted({int(h["slots"]) for h in history})
    for form in forms[1:]:
        for key in ("time/step_s", "time/forward_s", "time/update_s"):
            name = key.split("/")[1][:-2]
            row[f"speedup_{form}_{name}"] = row[forms[0]][key] / row[form][key]
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="write the results to this JSON file")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="the tiny model")
    parser.add_argument("--minibatches", type=int, default=1, help="shuffled, of whole prompts")
    parser.add_argument("--forms", nargs="+", choices=list(FORMS), default=list(FORMS))
    args = parser.parse_args(argv)
    results = []
    for w in QUICK if args.quick else WORKLOADS:
        row = measure(w, args.steps, args.warmup, tuple(args.forms), args.minibatches)
        print(json.dumps(row), flush=True)
        results.append(row)
    write_results(args.out, results)


if __name__ == "__main__":
    main()
