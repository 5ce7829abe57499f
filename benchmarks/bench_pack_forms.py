"""The update step and the log-prob forward of one rollout batch, padded and packed, as A/B
calls on the same batch and state (`train.pack_groups`, `jaxrl_llm.runner.packed_groups`).

Run with `python -m benchmarks.bench_pack_forms [--out FILE.json] [--repeat 9] [--quick]
[--stop-every N --budget T]`. Never part of the test suite's pass/fail.

`benchmarks.bench_trim` compares whole runs, whose rollouts drift apart after the first update
(float rounding changes the sampled tokens), so its phase times mix the forms' cost with their
batches'. Here one step of the trimmed, packed GRPO run of `bench_trim` (small model, 8 × 8,
`--stop-every` as the share of stopping byte ids, `--budget` new tokens) is taken, its
update batch captured, and the update and the policy's log-prob forward timed on that batch in
each form, the calls alternating (`--repeat` rounds, the first left out, medians):

- `padded`: the cut batch's padded rows, the forward and the update in the CPU's row groups
  (one host thread each, as the loop runs them; `sampling.row_groups` auto);
- `packed_one_call`: the groups packed (`pack_groups`), the forward and the update as one call;
- `packed`: packed in as many parts as row groups, each part from its own thread (what the
  loop runs on a CPU).

The last case is online DPO with `G = 8` samples (`configs/online_dpo.yaml`'s algorithm): its
update and reference forward run on the best and worst sample of each prompt, which the loop
packs as groups of 2 once chosen; the forward is then the reference's program over those
pairs.

Each update call starts from a copy of the same state (the step donates it). The batch's
padding share (`padding_share`) and the share of slots packing removes (`packed_slot_saving`,
what `train.pack_min_saving` weighs) are reported with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import bench_trim as trim
from benchmarks.workloads import Workload, load_average, write_results

# (stop every n-th byte id, budget, algorithm)
CASES = [
    (10, 256, "grpo"),
    (40, 256, "grpo"),
    (1000, 64, "grpo"),
    (1000, 32, "grpo"),
    (10, 256, "online_dpo"),
]
QUICK = Workload("tiny", 2, 2, 64)


def _captured_step(
    w: Workload, stop_every: int, row_groups: int | None, algorithm: str, run_dir: str
):
    """The context, captured update state and batch of a packed run's third step."""
    from jaxrl_llm.runner import loop
    from jaxrl_llm.train import preset

    alg = None
    if algorithm != "grpo":  # as its config in configs/: the preset, advantages unscaled
        alg = preset(algorithm)
        alg = dataclasses.replace(alg, advantage=dataclasses.replace(alg.advantage, scale="none"))
    prepared = trim._prepare(
        w, True, True, run_dir, stop_every=stop_every, row_groups=row_groups, algorithm=alg
    )
    ctx = prepared.context
    train = dataclasses.replace(ctx.config.train, pack_min_saving=0.0)  # pack every step
    ctx = ctx._replace(config=dataclasses.replace(ctx.config, train=train))
    update, captured = ctx.update, {}

    def capture(state, batch):
        captured["state"], captured["batch"] = jax.tree.map(jnp.copy, state), batch
        return update(state, batch)

    state, data = prepared.state, prepared.data
    for step in (1, 2, 3):
        state, data, _ = loop._rl_step(ctx._replace(update=capture), state, data, step)
    return ctx, state, captured["state"], captured["batch"]


def measure(
    stop_every: int,
    budget: int,
    repeat: int,
    workload: Workload | None = None,
    row_groups: int | None = None,
    algorithm: str = "grpo",
) -> dict:
    """Median seconds of the three forms' update and forward on one batch (module docstring):
    the small model at 8 × 8 × `budget` unless `workload` is given; `row_groups` None: auto;
    `algorithm` "online_dpo": the pairs it keeps of each prompt's samples (groups of 2)."""
    from jaxrl_llm.runner.packed_groups import (
        StepPacking,
        packed_forward,
        packed_slot_saving,
        padding_share,
    )
    from jaxrl_llm.runner.programs import (
        kept_rows_logprob_program,
        logprob_program,
        prompt_group_size,
        update_program,
    )
    from jaxrl_llm.runner.rollout import forward_in_row_groups
    from jaxrl_llm.train import (
        PackedSequences,
        SequenceBatch,
        group_rows_part,
        keeps_row_subset,
        pack_groups,
        packing_part,
    )

    w = workload or Workload("small", 8, 8, budget)
    with tempfile.TemporaryDirectory() as tmp:
        ctx, policy_state, state, batch = _captured_step(w, stop_every, row_groups, algorithm, tmp)
    config, groups = ctx.config, ctx.update_row_groups
    # the update batch's groups: the rollout's G samples, or online DPO's kept pairs
    kept = keeps_row_subset(config.algorithm, config.group_size)
    G = 2 if kept else config.group_size
    one_call = update_program(
        config.update_objective,
        ctx.graphs,
        config.optim,
        ctx.mesh,
        state,
        config.parallel,
        group_size=prompt_group_size(config, ctx.mesh, update=True),
        samples_per_prompt=config.group_size,
    )
    seqs = SequenceBatch(batch.tokens, batch.attention_mask, batch.completion_mask)
    host = jax.tree.map(np.asarray, seqs)
    whole, in_parts = pack_groups(host, G), pack_groups(host, G, parts=groups)
    parts = tuple(
        PackedSequences(
            jax.tree.map(lambda x, j=j: group_rows_part(x, j, groups, G), host),
            packing_part(in_parts, j, groups),
        )
        for j in range(groups)
    )
    whole, in_parts, parts = jax.device_put((whole, in_parts, parts))
    forms = {
        "padded": (ctx.update, None, None),
        "packed_one_call": (one_call, whole, StepPacking(whole, whole)),
        "packed": (ctx.update, in_parts, StepPacking(in_parts, in_parts, parts)),
    }
    group = prompt_group_size(config, ctx.mesh, update=False)
    alg = config.algorithm
    logprob = logprob_program(ctx.graphs.policy, alg.temperature, alg.chunk_size, group)
    if kept:
        logprob = kept_rows_logprob_program(ctx.graphs.policy, alg, group)
    params, frozen = policy_state.params["policy"], policy_state.frozen["policy"]

    def forward(packing):
        if packing is None:
            return forward_in_row_groups(ctx, logprob, params, frozen, seqs)
        return packed_forward(logprob, params, frozen, seqs, packing)

    times = {form: {"update": [], "forward": []} for form in forms}
    for round_ in range(repeat + 1):
        for form, (step, packed, packing) in forms.items():
            copy = jax.block_until_ready(jax.tree.map(jnp.copy, state))
            start = time.perf_counter()
            jax.block_until_ready(step(copy, batch._replace(packed=packed)))
            middle = time.perf_counter()
            jax.block_until_ready(forward(packing))
            end = time.perf_counter()
            if round_:
                times[form]["update"].append(middle - start)
                times[form]["forward"].append(end - middle)
    row = {
        "workload": f"{w.name}, stop every {stop_every}"
        + ("" if algorithm == "grpo" else f", {algorithm} pairs"),
        "width": int(batch.completion_mask.shape[1]),
        "padding_share": round(padding_share(host, G), 3),
        "slot_saving": round(packed_slot_saving(host, G, parts=groups), 3),
        "completion_rows": {
            "one_call": int(whole.tokens.shape[0]),
            "parts": int(in_parts.tokens.shape[0]),
        },
        "row_groups": groups,
        "repeat": repeat,
        "load_before": load_average(),
    }
    for form, phases in times.items():
        row[form] = {phase: statistics.median(t) for phase, t in phases.items()}
    for form in ("packed_one_call", "packed"):
        for phase in ("update", "forward"):
            row[f"speedup_{form}_{phase}"] = row["padded"][phase] / row[form][phase]
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="write the results to this JSON file")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--stop-every", type=int, default=None, help="one case: this share")
    parser.add_argument("--budget", type=int, default=256, help="with --stop-every")
    parser.add_argument("--algorithm", default="grpo", choices=["grpo", "online_dpo"])
    parser.add_argument("--quick", action="store_true", help="tiny 2 × 2 × 64, 2 row groups")
    args = parser.parse_args(argv)
    cases = CASES if args.stop_every is None else [(args.stop_every, args.budget, args.algorithm)]
    kw = {}
    if args.quick:
        cases, kw = cases[:1], {"workload": QUICK, "row_groups": 2}
    results = []
    for stop_every, budget, algorithm in cases:
        row = measure(stop_every, budget, args.repeat, algorithm=algorithm, **kw)
        print(json.dumps(row), flush=True)
        results.append(row)
    write_results(args.out, results)


if __name__ == "__main__":
    main()
