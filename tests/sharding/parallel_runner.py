"""Run by `test_parallel.py` with 8 simulated CPU devices (`python -m` this module).

One tiny GRPO problem (`tests/sharding/parallel_problem.py`) trained for 3 update steps:

- on 1 device (`make_update_step` without a mesh): the reference;
- with the jit update over the meshes (data, fsdp, tensor) = (8,1,1), (1,8,1), (2,2,2),
  (1,4,2) (automatic axes, as `jaxrl-llm train` builds them), the state placed by
  `train_state_shardings`;
- with the data-parallel update (`parallel: pmap`) on (8,1,1) under Explicit axes;
- with an objective that reads units of 2 rows (`Objective.row_unit`), against its own
  one-device run: the data-parallel update on (4,1,1) and the jit update on (2,2,2) under
  Explicit axes.

Each run's parameters, optimizer state, KL coefficient and metrics must match the reference
within `TOLERANCE` (float32). On every mesh each large matrix (and its Adam moments) must hold
`1 / (fsdp · tensor)` of its bytes per device. The compiled sampler on (8,1,1), (1,8,1) and
(1,4,2) must draw the tokens of one device ((2,2,2) under automatic axes is
`tests/sampler/test_sharded.py`'s check). `jaxrl-llm train` with `parallel: pmap` must log the
metrics of `parallel: jit` on 8 devices; a BCO preference run trains on (2,4,1) (its preparation
is one compiled program: `runner.programs.preference_prepare_program`), and a DPO run with the
reference's log-probs precomputed over the mesh.
The data-parallel step refuses meshes with fsdp/tensor > 1 and batches whose rows do not
split. Prints `RESULT {json}` with the measured differences.
"""

from __future__ import annotations

import json
import pathlib
import tempfile
import time

import jax
import numpy as np

from jaxrl_llm.cli import main as cli
from jaxrl_llm.train import make_update_step, train_state_shardings
from jaxrl_llm.train.parallel import make_data_parallel_update_step
from sharding import MeshConfig, make_mesh
from tests.runner.helpers import CONFIGS, PREFERENCE, TINY, records, train_records
from tests.sharding import parallel_problem as problem

JIT_MESHES = ((8, 1, 1), (1, 8, 1), (2, 2, 2), (1, 4, 2))
PMAP_MESH = (8, 1, 1)
EXPLICIT_MESH = (2, 2, 2)
SAMPLER_MESHES = ((8, 1, 1), (1, 8, 1), (1, 4, 2))
TOLERANCE = problem.TOLERANCE
_T0 = time.perf_counter()


def _log(message: str) -> None:
    wall, cpu = time.perf_counter() - _T0, time.process_time()
    print(f"[{wall:6.1f}s wall, {cpu:6.1f}s cpu] {message}", flush=True)


def check_large_matrices_are_split(state, sizes) -> None:
    """Per-device bytes of every large matrix (and its Adam moments) = total / (fsdp · tensor)."""
    _, fsdp, tensor = sizes
    mu = problem.adam_moments(state.opt_state)
    checked = 0
    for tree in (state.params, mu):
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
            if leaf.ndim < 2 or leaf.size < problem.LARGE:
                continue
            per_device = {s.data.nbytes for s in leaf.addressable_shards}
            expected = leaf.nbytes // (fsdp * tensor)
            assert per_device == {expected}, (jax.tree_util.keystr(path), sizes, per_device)
            checked += 1
    assert checked >= 2 * problem.LARGE_MATRICES, checked


def run_jit(sizes, batch, reference, axis_types="auto", objective=None):
    mesh = make_mesh(
        MeshConfig(data=sizes[0], fsdp=sizes[1], tensor=sizes[2], axis_types=axis_types)
    )
    state = problem.initial_state()
    shardings = train_state_shardings(state, mesh, problem.OPTIMIZER)
    state = jax.device_put(state, shardings)
    step = make_update_step(
        objective or problem.objective(),
        problem.OPTIMIZER,
        **problem.SCHEDULE,
        mesh=mesh,
        state_shardings=shardings,
    )
    state, metrics = problem.train(step, state, jax.device_put(batch, problem.rows_on(mesh)))
    check_large_matrices_are_split(state, sizes)
    return problem.differences(state, metrics, reference)


def run_pmap(batch, reference):
    mesh = make_mesh(MeshConfig(data=PMAP_MESH[0], fsdp=1, tensor=1))  # Explicit axes
    step = make_data_parallel_update_step(
        problem.objective(), problem.OPTIMIZER, **problem.SCHEDULE, mesh=mesh
    )
    state = jax.device_put(problem.initial_state(), problem.replicated(mesh))
    state, metrics = problem.train(step, state, jax.device_put(batch, problem.rows_on(mesh)))
    for leaf in jax.tree.leaves(state.params):  # a full replica on every device
        assert {s.data.nbytes for s in leaf.addressable_shards} == {leaf.nbytes}
    return problem.differences(state, metrics, reference)


def units_reference(batch):
    """An objective that reads units of 2 rows (`Objective.row_unit`, online DPO's pairs) and
    its one-device run: minibatches, micro-batches and the shuffled epochs move whole units."""
    paired = problem.objective()._replace(row_unit=2)
    single = make_update_step(paired, problem.OPTIMIZER, **problem.SCHEDULE)
    host = jax.tree.map(np.asarray, batch)
    return paired, problem.summary(*problem.train(single, problem.initial_state(), host))


def run_pmap_units(batch, paired, reference):
    """The units in the data-parallel step on (4,1,1): 8 rows per device = 2 minibatches × 2
    micro-batches of whole units; the shuffles permute the units of the global batch."""
    mesh = make_mesh(MeshConfig(data=4), devices=jax.devices()[:4])
    step = make_data_parallel_update_step(paired, problem.OPTIMIZER, **problem.SCHEDULE, mesh=mesh)
    state = jax.device_put(problem.initial_state(), problem.replicated(mesh))
    state, metrics = problem.train(step, state, jax.device_put(batch, problem.rows_on(mesh)))
    return problem.differences(state, metrics, reference)


def check_pmap_refusals(batch) -> None:
    try:
        make_data_parallel_update_step(
            problem.objective(), problem.OPTIMIZER, mesh=make_mesh(MeshConfig(data=4, fsdp=2))
        )
    except ValueError as err:
        assert "fsdp = tensor = 1" in str(err) and "fsdp=2" in str(err), err
    else:
        raise AssertionError("the data-parallel step accepted fsdp = 2")
    mesh = make_mesh(MeshConfig(data=8))
    step = make_data_parallel_update_step(
        problem.objective(), problem.OPTIMIZER, **problem.SCHEDULE, mesh=mesh
    )
    rows = 8 * 3  # 3 rows per device, 2 minibatches × 2 micro-batches
    short = jax.tree.map(lambda x: x[:rows], batch)
    try:
        step(jax.device_put(problem.initial_state(), problem.replicated(mesh)), short)
    except ValueError as err:
        assert "N = 3 rows on each of the 8 devices" in str(err), err
    else:
        raise AssertionError("the data-parallel step accepted 3 rows per device")


def check_sampler() -> int:
    """The compiled sampler on every mesh (parameters placed by their logical axes) draws the
    one-device tokens; returns how many tokens were compared."""
    single = problem.sample(None)
    for sizes in SAMPLER_MESHES:
        out = problem.sample(sizes)
        np.testing.assert_array_equal(out["tokens"], single["tokens"], err_msg=str(sizes))
        np.testing.assert_array_equal(out["lengths"], single["lengths"], err_msg=str(sizes))
        np.testing.assert_allclose(out["logprobs"], single["logprobs"], atol=1e-5)
    return int(single["tokens"].size)


def check_runner() -> float:
    """`jaxrl-llm train` (GRPO, 2 steps, 8 prompts × 2 samples, the KL reference synced after
    each step) with `parallel: pmap` logs the metrics of `parallel: jit` on the same 8-device
    data mesh; returns the largest relative difference. Three quarters of the byte ids stop a
    row, so both cut the batches' 32 completion slots to their longest
    (`train.trim_completions`) on the mesh; the jit run asks for packed groups
    (`train.pack_groups`), which a mesh of several devices runs padded."""
    stops = ",".join(str(i) for i in range(256) if i % 4)
    overrides = [
        *TINY,
        f"sampling.stop_tokens=[{stops}]",
        "sampling.max_new_tokens=32",
        "train.trim_minimum=4",
        "train.prompts_per_step=8",
        "train.reference_sync={every: 1, alpha: 0.5}",
        "train.eval_prompts=0",
        "checkpoint.every=100",
        "export.enabled=false",
        "mesh={data: 8, fsdp: 1, tensor: 1, axis_types: auto}",
    ]
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for parallel in ("jit", "pmap"):
            run_dir = pathlib.Path(tmp) / parallel
            argv = ["train", str(CONFIGS / "grpo.yaml"), *overrides, f"parallel={parallel}"]
            if parallel == "jit":  # packing is a no-op on a mesh of several devices
                argv.append("train.pack_groups=true")
            assert cli([*argv, "--run-dir", str(run_dir)]) == 0, parallel
            runs[parallel] = train_records(run_dir)
            steps = [r for r in records(run_dir) if "loss/total" in r]
            widths = [r["perf/completion_width"] for r in steps]
            assert widths and all(w < 32 for w in widths), (parallel, widths)
            assert not any("perf/packed_rows" in r for r in steps), parallel
    jit, pmap = runs["jit"], runs["pmap"]
    assert [r["step"] for r in pmap] == [1, 2], pmap
    assert [r["ref/synced"] for r in pmap] == [1.0, 1.0] and pmap[1]["kl/mean"] > 0, pmap
    worst = 0.0
    for a, b in zip(jit, pmap, strict=True):
        assert sorted(a) == sorted(b)
        for key, value in a.items():
            if isinstance(value, float | int):
                worst = max(worst, abs(value - b[key]) / max(1.0, abs(value)))
    assert worst <= TOLERANCE, worst
    return worst


def check_preference_runner() -> float:
    """`jaxrl-llm train configs/bco.yaml` (8 pairs, 2 steps) runs on a (2, 4, 1) mesh: the
    per-row fields that the preparation adds (BCO's shift δ, KTO's reference point) are placed
    over the batch axes, as the update step takes them; the reference is synced into the
    state (placed like the parameters) after each step. Returns δ after step 2."""
    overrides = [*PREFERENCE, "train.prompts_per_step=8", "train.eval_prompts=0"]
    overrides += ["train.reference_sync={every: 1, alpha: 0.5}"]
    overrides += ["export.enabled=false", "mesh={data: 2, fsdp: 4, tensor: 1, axis_types: auto}"]
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["train", str(CONFIGS / "bco.yaml"), *overrides, "--run-dir", tmp]
        assert cli(argv) == 0
        steps = train_records(tmp)
    assert [r["step"] for r in steps] == [1, 2], steps
    assert all(np.isfinite(v) for r in steps for v in r.values()), steps
    return steps[1]["pref/delta"]


def check_precomputed_reference_runner() -> float:
    """`configs/dpo.yaml` with `preference.precompute_reference` on a (2, 4, 1) mesh: the
    reference's table is built over the mesh (batches placed over the batch axes, the sums
    gathered to the host) for the train and eval examples, then one step and an evaluation
    read it. `preference.packing` is on too and, on a mesh of several devices, packs nothing
    (the padded forwards run; no `perf/packing_fill`). Returns the step's loss."""
    overrides = [*PREFERENCE, "train.prompts_per_step=8", "train.steps=1", "train.eval_prompts=8"]
    overrides += ["preference.precompute_reference=true", "train.eval_every=1"]
    overrides += ["preference.packing=true"]
    overrides += ["export.enabled=false", "mesh={data: 2, fsdp: 4, tensor: 1, axis_types: auto}"]
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["train", str(CONFIGS / "dpo.yaml"), *overrides, "--run-dir", tmp]
        assert cli(argv) == 0
        steps = train_records(tmp)
    assert [r["step"] for r in steps] == [1], steps
    assert all(np.isfinite(v) for r in steps for v in r.values()), steps
    assert "perf/packing_fill" not in steps[0], steps
    return steps[0]["loss/total"]


def main() -> None:
    assert jax.device_count() == 8, f"expected 8 devices, got {jax.device_count()}"
    batch = problem.batch()
    _log("batch ready")
    reference = problem.reference_run(batch)
    _log("1-device reference")
    results = {}
    for sizes in JIT_MESHES:
        results["jit" + str(sizes)] = run_jit(sizes, batch, reference)
        _log(f"jit {sizes}")
    # Explicit axes: the model names its ops' layouts and the epoch shuffle keeps the row split
    results["jit_explicit" + str(EXPLICIT_MESH)] = run_jit(
        EXPLICIT_MESH, batch, reference, axis_types="explicit"
    )
    _log(f"jit explicit {EXPLICIT_MESH}")
    results["pmap" + str(PMAP_MESH)] = run_pmap(batch, reference)
    _log("pmap")
    paired, paired_reference = units_reference(batch)
    results["pmap_units(4, 1, 1)"] = run_pmap_units(batch, paired, paired_reference)
    results["jit_explicit_units(2, 2, 2)"] = run_jit(
        EXPLICIT_MESH, batch, paired_reference, axis_types="explicit", objective=paired
    )
    _log("pmap and jit explicit, units of 2 rows")
    check_pmap_refusals(batch)
    _log("refusals")
    results["sampler_tokens"] = check_sampler()
    _log("sampler")
    results["runner_metrics"] = check_runner()
    _log("runner")
    results["preference_delta"] = check_preference_runner()
    _log("preference runner")
    results["precomputed_reference_loss"] = check_precomputed_reference_runner()
    _log("precomputed reference runner")
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
