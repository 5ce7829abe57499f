"""`parallel: pmap` in run configs and the data-parallel step's own checks (one device)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import AbstractMesh

from jaxrl_llm.config import ConfigError
from jaxrl_llm.runner import load_run_config
from jaxrl_llm.runner.config import check_devices
from jaxrl_llm.runner.programs import update_program
from jaxrl_llm.train import SequenceBatch, count_normalizers, init_train_state
from jaxrl_llm.train.objectives import Objective
from jaxrl_llm.train.parallel import check_data_parallel, make_data_parallel_update_step
from sharding import MeshConfig, make_mesh
from tests.runner.helpers import CONFIGS, TINY

GRPO = CONFIGS / "grpo.yaml"
SFT = CONFIGS / "sft.yaml"


def _mesh(data, fsdp=1, tensor=1):
    return AbstractMesh((data, fsdp, tensor), ("data", "fsdp", "tensor"))


def test_pmap_configs_load():
    cfg = load_run_config(GRPO, [*TINY, "parallel=pmap"], run_dir="unused")
    assert cfg.parallel == "pmap"
    assert check_devices(cfg, 2) == (2, 1, 1)  # 2 prompts × 2 samples: 2 rows per device
    cfg = load_run_config(SFT, ["parallel=pmap", "mesh={data: 4}"], run_dir="unused")
    assert cfg.parallel == "pmap"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["mesh={data: -1, fsdp: 2}"], "needs mesh.fsdp = mesh.tensor = 1, got fsdp=2, tensor=1"),
        (["mesh={data: 1, tensor: 2}"], "got fsdp=1, tensor=2; use parallel: jit"),
        (
            [
                "rewards.jax_native=true",
                "rewards.functions=[{fn: exact_answer}]",
                "train.compiled_iterations=1",
            ],
            "not available with train.compiled_iterations",
        ),
        (
            # 4 rows over 2 devices: 2 each, not 2 minibatches × 2 micro-batches
            ["mesh={data: 2}", "algorithm.minibatches=2", "optim.accumulation_steps=2"],
            "each of the 2 devices gets 2 of the step's 4 rows, not divisible into "
            "algorithm.minibatches × optim.accumulation_steps = 2 × 2",
        ),
    ],
)
def test_pmap_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=r"^(parallel|train\.prompts_per_step): ") as err:
        load_run_config(GRPO, [*TINY, "parallel=pmap", *overrides], run_dir="unused")
    assert message in str(err.value)


def test_pmap_rows_per_device_are_checked_when_the_device_count_is_known():
    overrides = [
        *TINY,
        "parallel=pmap",
        "train.prompts_per_step=4",
        "algorithm.minibatches=2",
        "optim.accumulation_steps=2",
    ]
    cfg = load_run_config(GRPO, overrides, run_dir="unused")  # data: -1, resolved at start
    assert check_devices(cfg, 2) == (2, 1, 1)  # 8 rows: 4 per device = 2 × 2 micro-batches
    with pytest.raises(ConfigError, match="each of the 4 devices gets 2 of the step's 8 rows"):
        check_devices(cfg, 4)
    jit = load_run_config(GRPO, [o for o in overrides if o != "parallel=pmap"], run_dir="unused")
    assert check_devices(jit, 4) == (4, 1, 1)  # the jit step splits the global rows


def test_unknown_parallel_value_is_rejected():
    with pytest.raises(ConfigError, match="parallel"):
        load_run_config(GRPO, [*TINY, "parallel=pjit"], run_dir="unused")
    with pytest.raises(ValueError, match="`parallel` must be 'jit' or 'pmap', got 'dp'"):
        update_program(None, None, None, None, None, "dp")


def test_online_dpo_splits_its_pairs_into_micro_batches():
    dpo = CONFIGS / "online_dpo.yaml"
    base = [*TINY, "sampling.num_samples=4", "train.prompts_per_step=6"]
    cfg = load_run_config(dpo, [*base, "optim.accumulation_steps=2"], run_dir="unused")
    assert (cfg.rows_per_step, cfg.update_rows, cfg.update_unit) == (24, 12, 2)
    with pytest.raises(ConfigError, match=r"update has 6 pairs of rows .* = 4 × 1 equal micro"):
        load_run_config(dpo, [*base, "algorithm.minibatches=4"], run_dir="unused")  # 24 rows
    pmap = [*TINY, "sampling.num_samples=4", "parallel=pmap", "optim.accumulation_steps=2"]
    cfg = load_run_config(dpo, [*pmap, "train.prompts_per_step=4"], run_dir="unused")
    assert check_devices(cfg, 2) == (2, 1, 1)  # 2 pairs per device, one per micro-batch
    with pytest.raises(ConfigError, match=r"gets 2 of the step's 8 rows \(whole units of 2 rows\)"):
        check_devices(cfg, 4)


def test_minibatches_of_whole_prompts_need_the_prompts_to_split():
    unit = [*TINY, "algorithm.minibatch_unit=prompt", "train.prompts_per_step=2"]
    cfg = load_run_config(GRPO, [*unit, "algorithm.minibatches=2"], run_dir="unused")
    assert (cfg.update_rows, cfg.update_unit) == (4, 2)
    message = r"update has 2 prompts of 2 rows \(algorithm.minibatch_unit: prompt\)"
    with pytest.raises(ConfigError, match=message):  # 4 rows, but 2 prompts
        load_run_config(GRPO, [*unit, "algorithm.minibatches=4"], run_dir="unused")
    rows = [o for o in unit if "minibatch_unit" not in o]
    assert load_run_config(GRPO, [*rows, "algorithm.minibatches=4"], run_dir="unused")
    with pytest.raises(
        ConfigError, match=r"algorithm\.minibatch_unit: must be one of 'row', 'prompt'"
    ):
        load_run_config(GRPO, [*TINY, "algorithm.minibatch_unit=group"], run_dir="unused")


def test_check_data_parallel():
    assert check_data_parallel(_mesh(8), 32, minibatches=2, accumulation_steps=2) == 8
    assert check_data_parallel(_mesh(2), 16, minibatches=2, accumulation_steps=2, unit=2) == 2
    with pytest.raises(ValueError, match="micro-batches of whole units of 2 rows; use a multiple"):
        check_data_parallel(_mesh(2), 8, minibatches=2, accumulation_steps=2, unit=2)
    assert check_data_parallel(_mesh(1)) == 1
    with pytest.raises(ValueError, match="fsdp=1, tensor=4"):
        check_data_parallel(_mesh(2, 1, 4))
    with pytest.raises(ValueError, match="`rows` = 12 does not split over the 8 devices"):
        check_data_parallel(_mesh(8), 12)
    with pytest.raises(ValueError, match="use a multiple of 32 rows"):
        check_data_parallel(_mesh(8), 16, minibatches=4)
    with pytest.raises(ValueError, match="must have the axes data, fsdp, tensor"):
        check_data_parallel(AbstractMesh((2,), ("batch",)))


def _toy():
    """A linear least-squares objective: loss = Σ (w·x_t − y_t)² / global token count."""

    def loss(p, f, b, n, k):
        x = b.tokens[:, : b.completion_mask.shape[1]].astype(jnp.float32)
        err = (p["policy"]["w"] * x - b.completion_mask) ** 2
        total = jnp.sum(err) / n.num_tokens
        return total, {"loss/total": total, "toy/err": jnp.mean(err)}

    return Objective(loss, lambda b: count_normalizers(b.completion_mask), lambda b, n: None)


def test_the_data_parallel_step_on_one_device_equals_the_plain_step():
    """On one device the shard_map path (pmean / psum over an axis of size 1, all-gathered
    shuffles) is the plain step: 2 epochs × 2 shuffled minibatches × 2 micro-batches."""
    from jaxrl_llm.train import make_update_step

    tx = optax.MultiSteps(optax.adam(0.1), every_k_schedule=2)
    kw = dict(epochs=2, minibatches=2, accumulation_steps=2, shuffle=True)
    tokens = (jnp.arange(8 * 5) % 7).reshape(8, 5).astype(jnp.int32)
    batch = SequenceBatch(tokens, jnp.ones((8, 5)), (tokens[:, :3] % 2).astype(jnp.float32))
    mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
    out = {}
    for name, step in (
        ("plain", make_update_step(_toy(), tx, **kw)),
        ("dp", make_data_parallel_update_step(_toy(), tx, mesh=mesh, **kw)),
    ):
        s = init_train_state({"policy": {"w": jnp.ones(3)}}, {}, tx, key=jax.random.key(3))
        for _ in range(2):
            s, metrics = step(s, batch)
        out[name] = (s.params["policy"]["w"], metrics)
    assert jnp.allclose(out["plain"][0], out["dp"][0], atol=1e-6), out
    for key, value in out["plain"][1].items():
        assert jnp.allclose(value, out["dp"][1][key], atol=1e-6), key
