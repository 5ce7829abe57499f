"""`train.reference_sync`: the reference policy moves toward the policy during a run (TR-DPO's
soft update, TRL's `sync_ref_model`; ProRL's reset with `alpha: 1`), lives in the train state
and resumes with it."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxrl_llm.cli import main
from jaxrl_llm.config import ConfigError
from jaxrl_llm.runner import load_run_config, prepare_run
from jaxrl_llm.train import init_train_state, make_optimizer, sync_reference
from tests.runner.helpers import CONFIGS, PREFERENCE, TINY, train_records

GRPO, DPO = str(CONFIGS / "grpo.yaml"), str(CONFIGS / "dpo.yaml")


def _state(policy, reference):
    return init_train_state(
        {"policy": policy}, {}, optax.sgd(0.1), key=jax.random.key(0), reference=reference
    )


def test_sync_mixes_the_policy_into_the_reference():
    rng = np.random.default_rng(0)
    theta = {"a": rng.normal(size=(3, 4)), "b": rng.normal(size=5)}
    ref = {"a": rng.normal(size=(3, 4)), "b": rng.normal(size=5)}
    state = _state(*(jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), t) for t in (theta, ref)))
    for alpha in (0.6, 0.25):
        out = jax.jit(sync_reference, static_argnums=1)(state, alpha).reference
        for key in theta:  # float64 reference of α·θ + (1 − α)·ref
            expected = alpha * theta[key] + (1 - alpha) * ref[key]
            np.testing.assert_allclose(out[key], expected, rtol=1e-6, atol=1e-6)
    reset = sync_reference(state, 1.0)
    for key in theta:  # alpha 1: the policy's values, bit for bit
        np.testing.assert_array_equal(reset.reference[key], state.params["policy"][key])
        np.testing.assert_array_equal(reset.params["policy"][key], state.params["policy"][key])
    bf16 = _state({"w": jnp.ones(4, jnp.bfloat16)}, {"w": jnp.zeros(4, jnp.bfloat16)})
    assert sync_reference(bf16, 0.5).reference["w"].dtype == jnp.bfloat16


def test_sync_errors_name_the_problem():
    with pytest.raises(ValueError, match="holds no reference"):
        sync_reference(_state({"w": jnp.ones(2)}, None), 0.5)
    with pytest.raises(ValueError, match=r"`alpha` must be in \(0, 1\]"):
        sync_reference(_state({"w": jnp.ones(2)}, {"w": jnp.ones(2)}), 0.0)


def _grpo(run_dir, *extra):
    return main(["train", GRPO, *TINY, *extra, "--run-dir", str(run_dir)])


def test_grpo_with_a_reset_every_step_reads_a_zero_kl(tmp_path):
    """`alpha: 1, every: 1`: each step starts with reference = policy, and one update per step
    measures the KL before moving, so it is 0 (up to the rounding of two forward programs, as
    at the first step of any run); without the sync it grows (the next test's step 3)."""
    assert (
        _grpo(tmp_path / "reset", "train.steps=3", "train.reference_sync={every: 1, alpha: 1}") == 0
    )
    reset = train_records(tmp_path / "reset")
    assert [r["ref/synced"] for r in reset] == [1.0, 1.0, 1.0]
    assert all(abs(r["kl/mean"]) < 1e-12 for r in reset)


def test_a_soft_synced_reference_is_checkpointed_and_resumes(tmp_path):
    sync = ["train.reference_sync={every: 2, alpha: 0.5}", "checkpoint.every=2"]
    four = [*sync, "train.steps=4"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert _grpo(straight, *four) == 0
    assert _grpo(split, *sync, "train.steps=2") == 0
    assert main(["train", GRPO, *TINY, *four, "--resume", "--run-dir", str(split)]) == 0
    steps = train_records(straight)
    assert [r["ref/synced"] for r in steps] == [0.0, 1.0, 0.0, 1.0]
    assert train_records(split) == steps  # the KL of steps 3, 4 reads the synced reference
    assert steps[2]["kl/mean"] > 0.0


def test_a_reset_with_the_optimizer_restarts_its_state(tmp_path):
    """`reset_optimizer: true` (ProRL's hard reset): after the sync the optimizer state is the
    fresh one of the current parameters (zero moments, step count 0)."""
    sync = "train.reference_sync={every: 2, alpha: 1, reset_optimizer: true}"
    overrides = [*TINY, sync, "train.steps=2", "checkpoint.every=2"]
    assert _grpo(tmp_path, *overrides[len(TINY) :]) == 0
    prepared = prepare_run(load_run_config(GRPO, overrides, run_dir=tmp_path), resume=True)
    prepared.checkpointer.close()
    state = prepared.state
    assert prepared.start_step == 2 and int(state.step) == 2
    fresh = make_optimizer(load_run_config(GRPO, overrides, run_dir=tmp_path).optim).init(
        state.params
    )
    for ours, theirs in zip(jax.tree.leaves(state.opt_state), jax.tree.leaves(fresh), strict=True):
        np.testing.assert_array_equal(ours, theirs)
    policy = jax.tree.leaves(state.params["policy"])
    for ref, param in zip(jax.tree.leaves(state.reference), policy, strict=True):
        np.testing.assert_array_equal(ref, param)  # alpha 1: the policy itself


def test_dpo_with_a_reset_every_step_stays_at_log_2(tmp_path):
    """DPO's loss is −log σ(β·(Δ_policy − Δ_ref)): with the reference reset to the policy before
    every step it is log 2 at every step (the margin is 0), as it is only at the first step of
    a run against the initial policy."""
    common = [*PREFERENCE, "train.steps=3", "optim.learning_rate=0.05"]
    reset = [*common, "train.reference_sync={every: 1, alpha: 1}"]
    assert main(["train", DPO, *reset, "--run-dir", str(tmp_path / "reset")]) == 0
    assert main(["train", DPO, *common, "--run-dir", str(tmp_path / "fixed")]) == 0
    losses_reset = [r["loss/total"] for r in train_records(tmp_path / "reset")]
    losses_fixed = [r["loss/total"] for r in train_records(tmp_path / "fixed")]
    np.testing.assert_allclose(losses_reset, math.log(2.0), rtol=1e-6)
    assert losses_fixed[0] == pytest.approx(math.log(2.0), rel=1e-6)
    assert abs(losses_fixed[-1] - math.log(2.0)) > 1e-4


def test_reference_sync_config_errors(tmp_path):
    run_dir = tmp_path / "bad"
    no_kl = ["algorithm.kl={mode: none}", "train.reference_sync={every: 2}"]
    with pytest.raises(ConfigError, match=r"train.reference_sync: this run reads no reference"):
        load_run_config(GRPO, [*TINY, *no_kl], run_dir=run_dir)
    lora = ["model.lora={rank: 2}", "train.reference_sync={every: 2, alpha: 0.5}"]
    with pytest.raises(ConfigError, match=r"reference_sync.alpha: 0.5 with LoRA adapters"):
        load_run_config(GRPO, [*TINY, *lora], run_dir=run_dir)
    load_run_config(
        GRPO,
        [*TINY, "model.lora={rank: 2}", "train.reference_sync={every: 2, alpha: 1}"],
        run_dir=run_dir,
    )
    for bad, message in (
        ("{every: 0}", "every: must be an int >= 1"),
        ("{every: 2, alpha: 1.5}", r"alpha: must be in \(0, 1\]"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_run_config(GRPO, [*TINY, f"train.reference_sync={bad}"], run_dir=run_dir)
