"""Algorithm configs, presets, YAML files and the composed RL loss (no model: arrays only)."""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.config import ConfigError, build, load_yaml
from jaxrl_llm.train import (
    PRESETS,
    AdvantageConfig,
    AlgorithmConfig,
    CriticConfig,
    KLConfig,
    PolicyLossConfig,
    RLBatch,
    RolloutCorrectionConfig,
    count_normalizers,
    kl_controller,
    preset,
    rl_loss,
)
from jaxrl_llm.train.algorithms import online_dpo_normalizers

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
N, T = 6, 5


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_has_a_yaml_file_with_the_same_algorithm(name):
    data = load_yaml(CONFIGS / f"{name}.yaml")
    assert build(AlgorithmConfig, data["algorithm"], path="algorithm") == preset(name)


def test_variant_yaml_loads():
    cfg = build(
        AlgorithmConfig, load_yaml(CONFIGS / "ppo_value_head_adaptive_kl.yaml")["algorithm"]
    )
    assert cfg.critic == CriticConfig(kind="head", coef=0.5, clip=0.2)
    assert cfg.kl.target == 0.1 and cfg.kl.resolved_estimator == "k3"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: AdvantageConfig(estimator="gae", scale="none"),
            "`scale` is not used by estimator 'gae'",
        ),
        (lambda: AdvantageConfig(estimator="reinforce_pp", whiten=True), "already whitens"),
        (
            lambda: AdvantageConfig(estimator="gae", drop_zero_variance=True),
            "needs a grouped estimator",
        ),
        (lambda: AdvantageConfig(lam=1.5, estimator="gae"), "`lam` must lie in [0, 1]"),
        (
            lambda: PolicyLossConfig(name="sapo", clip_low=0.1),
            "`clip_low` is not used by loss 'sapo'",
        ),
        (lambda: PolicyLossConfig(name="gmpo", agg="token_mean"), "gmpo is a mean over sequences"),
        (lambda: PolicyLossConfig(norm_length=8), "only used by agg 'seq_mean_token_sum_norm'"),
        (lambda: KLConfig(mode="loss"), "needs `coef` > 0"),
        (lambda: KLConfig(coef=0.1), "mode='none' takes no `coef`"),
        (lambda: KLConfig(mode="loss", coef=0.1, horizon=50.0), "set `target` too"),
        (lambda: KLConfig(horizon=50.0), "read only by the adaptive controller"),
        (lambda: KLConfig(mode="loss", coef=0.1, estimator="k1"), "k1 has a zero-mean gradient"),
        (lambda: CriticConfig(coef=0.0), "`coef` must be > 0"),
        (lambda: AlgorithmConfig(critic=CriticConfig()), "the 'gae' estimator needs a `critic`"),
        (
            lambda: AlgorithmConfig(
                advantage=AdvantageConfig(estimator="reinforce_pp_baseline"),
                kl=KLConfig(mode="reward", coef=0.1),
            ),
            "not defined for 'reinforce_pp_baseline'",
        ),
        (
            lambda: AlgorithmConfig(kl=KLConfig(mode="reward", coef=0.1, estimator="k3")),
            "is the k1 sum",
        ),
        (lambda: AlgorithmConfig(epochs=0), "`epochs` must be >= 1"),
        (lambda: RolloutCorrectionConfig(high=0.0), "`high` must be > 0"),
        (lambda: RolloutCorrectionConfig(low=-1.0), "`low` must be >= 0"),
        (lambda: RolloutCorrectionConfig(low=3.0, high=2.0), "must be below `high`"),
        (
            lambda: PolicyLossConfig(name="online_dpo", loss_type="exo_pair"),
            "cannot run loss_type 'exo_pair': dpo_loss: `label_smoothing` must lie in (0, 1)",
        ),
        (lambda: preset("ppo2"), "unknown algorithm 'ppo2'"),
    ],
)
def test_bad_algorithm_configs_raise_with_the_field_name(make, message):
    with pytest.raises(ValueError, match=None) as info:
        make()
    assert message in str(info.value)


def test_yaml_errors_name_the_key_path():
    with pytest.raises(ConfigError, match=r"algorithm\.policy_loss\.name: must be one of"):
        build(AlgorithmConfig, {"policy_loss": {"name": "ppo"}}, path="algorithm")
    with pytest.raises(ConfigError, match="did you mean 'entropy_coef'"):
        build(AlgorithmConfig, {"entropy_coeff": 0.1})


def _arrays(seed: int = 0) -> dict[str, jax.Array]:
    rng = np.random.default_rng(seed)
    lengths = np.array([5, 3, 1, 4, 2, 5])
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
    out = {
        "mask": mask,
        "logp": -rng.uniform(0.1, 3.0, (N, T)),
        "old": -rng.uniform(0.1, 3.0, (N, T)),
        "ref": -rng.uniform(0.1, 3.0, (N, T)),
        "adv": rng.normal(size=(N, T)),
        "entropy": rng.uniform(0.5, 2.0, (N, T)),
        "values": rng.normal(size=(N, T)),
        "old_values": rng.normal(size=(N, T)),
        "returns": rng.normal(size=(N, T)),
    }
    out["old"] = out["logp"] + rng.uniform(-0.4, 0.4, (N, T))  # ratios around 1, some clipped
    return {k: np.asarray(v, np.float64) for k, v in out.items()}


def _batch(a: dict, rows=slice(None)) -> RLBatch:
    f = lambda k: jnp.asarray(a[k][rows], jnp.float32)  # noqa: E731
    n = a["mask"][rows].shape[0]
    return RLBatch(
        tokens=jnp.zeros((n, T + 2), jnp.int32),
        attention_mask=jnp.ones((n, T + 2), jnp.int32),
        completion_mask=f("mask"),
        advantages=f("adv"),
        old_logp=f("old"),
        ref_logp=f("ref"),
        old_values=f("old_values"),
        returns=f("returns"),
    )


def _loss(cfg, a, rows=slice(None), norms=None, kl_coef=0.1):
    batch = _batch(a, rows)
    norms = norms or count_normalizers(batch.completion_mask)
    f = lambda k: jnp.asarray(a[k][rows], jnp.float32)  # noqa: E731
    values = f("values") if cfg.critic is not None else None
    return rl_loss(
        cfg, batch, norms, logp=f("logp"), entropy=f("entropy"), values=values, kl_coef=kl_coef
    )


def test_ppo_composition_matches_a_numpy_reference():
    cfg = AlgorithmConfig(
        advantage=AdvantageConfig(estimator="gae"),
        policy_loss=PolicyLossConfig(clip_low=0.2, clip_high=0.28, agg="token_mean"),
        kl=KLConfig(mode="loss", coef=0.3, estimator="k3"),
        critic=CriticConfig(coef=0.5, clip=0.2),
        entropy_coef=0.01,
    )
    a = _arrays()
    m = a["mask"]
    D = m.sum()
    r = np.exp(a["logp"] - a["old"])
    pg_tok = np.maximum(-a["adv"] * r, -a["adv"] * np.clip(r, 0.8, 1.28))
    pg = (pg_tok * m).sum() / D
    d = a["logp"] - a["ref"]
    kl = ((np.exp(-d) - 1 + d) * m).sum() / D
    ent = (a["entropy"] * m).sum() / D
    v, old_v, R = a["values"], a["old_values"], a["returns"]
    v_c = np.clip(v, old_v - 0.2, old_v + 0.2)
    vl = (0.5 * np.maximum((v - R) ** 2, (v_c - R) ** 2) * m).sum() / D
    beta = 0.07  # the controller's β, not kl.coef, weighs the KL loss
    expected = pg + beta * kl - 0.01 * ent + 0.5 * vl
    loss, metrics = _loss(cfg, a, kl_coef=beta)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["loss/policy"]), pg, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["loss/kl"]), kl, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["loss/entropy"]), ent, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["loss/value"]), vl, rtol=1e-5)
    per_seq = ((a["old"] - a["ref"]) * m).sum(1) / np.maximum(m.sum(1), 1)
    np.testing.assert_allclose(float(metrics["kl/seq_k1"]), per_seq.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["entropy/mean"]), ent, rtol=1e-5)


_COMPOSITIONS = {
    **PRESETS,
    "gmpo": AlgorithmConfig(policy_loss=PolicyLossConfig(name="gmpo")),
    "reinforce_token_sum": AlgorithmConfig(
        policy_loss=PolicyLossConfig(name="reinforce", agg="token_sum")
    ),
    "gspo_seq_sum": AlgorithmConfig(
        policy_loss=PolicyLossConfig(name="gspo", agg="seq_mean_token_sum"),
        kl=KLConfig(mode="loss", coef=0.1),
        entropy_coef=0.05,
    ),
    "ppo_head_norm": dataclasses.replace(
        PRESETS["ppo"],
        policy_loss=PolicyLossConfig(agg="seq_mean_token_sum_norm", norm_length=7),
        critic=CriticConfig(kind="head", agg="seq_mean_token_mean"),
        entropy_coef=0.01,
    ),
}


@pytest.mark.filterwarnings("ignore:gspo_loss")
@pytest.mark.parametrize("name", sorted(_COMPOSITIONS))
def test_micro_batches_with_global_normalisers_add_up_to_the_whole(name):
    cfg = _COMPOSITIONS[name]
    a = _arrays(seed=3)
    norms = count_normalizers(jnp.asarray(a["mask"]))
    slices = (slice(0, 2), slice(2, 3), slice(3, 6))
    if cfg.policy_loss.name == "online_dpo":  # pairs stay whole; the count is of valid pairs
        norms, slices = online_dpo_normalizers(_batch(a)), (slice(0, 2), slice(2, 6))
    full, _ = _loss(cfg, a, norms=norms)
    parts = [_loss(cfg, a, rows, norms)[0] for rows in slices]
    np.testing.assert_allclose(float(sum(parts)), float(full), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["ppo_clip", "cispo", "sapo"])
def test_on_policy_gradient_is_the_plain_policy_gradient(name):
    """ratio ≡ 1 (old_logp None → stop_gradient(logp)): ∂L/∂logp = −A·m / D_tok."""
    cfg = AlgorithmConfig(policy_loss=PolicyLossConfig(name=name, agg="token_mean"))
    a = _arrays(seed=5)
    batch = _batch(a)._replace(old_logp=None, ref_logp=None)
    norms = count_normalizers(batch.completion_mask)

    def f(lp):
        return rl_loss(cfg, batch, norms, logp=lp, entropy=jnp.zeros((N, T)))[0]

    grad = jax.grad(f)(jnp.asarray(a["logp"], jnp.float32))
    np.testing.assert_allclose(grad, -a["adv"] * a["mask"] / a["mask"].sum(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(("estimator", "clamped"), [("k2", False), ("abs", False), ("k3", True)])
def test_kl_loss_term_clamps_only_k3(estimator, clamped):
    """k3 as a loss is clamped to ±10 (verl's low_var_kl); k2 and abs are not (verl's mse / abs):
    a clamp there zeroed the gradient of tokens that drifted by more than √20 from the reference."""
    cfg = AlgorithmConfig(kl=KLConfig(mode="loss", coef=1.0, estimator=estimator))
    assert cfg.kl.loss_clamp == (10.0 if clamped else None)
    a = _arrays(seed=6)
    batch = _batch(a)._replace(old_logp=None, advantages=jnp.zeros((N, T)))
    norms = count_normalizers(batch.completion_mask)
    lp = np.asarray(a["ref"], np.float32).copy()
    lp[0, 0] -= 12.0  # d = −12: k2 = 72, |d| = 12, k3 ≈ e^12 — all beyond the clamp

    def kl_part(x):
        return rl_loss(cfg, batch, norms, logp=x, entropy=jnp.zeros((N, T)), kl_coef=1.0)[0]

    g = np.asarray(jax.grad(kl_part)(jnp.asarray(lp)))
    if clamped:
        assert g[0, 0] == 0.0
    else:
        slope = {"k2": -12.0, "abs": -1.0}[estimator]
        np.testing.assert_allclose(g[0, 0], slope / a["mask"].sum(), rtol=1e-5)


def test_kl_controller_is_fixed_or_adaptive():
    fixed = kl_controller(KLConfig(mode="loss", coef=0.2))
    assert float(fixed.update(fixed.init(), 5.0, 64).beta) == pytest.approx(0.2)
    adaptive = kl_controller(KLConfig(mode="reward", coef=0.2, target=0.1, horizon=100))
    # e = clip(0.3/0.1 − 1, ±0.2) = 0.2 ;  β·(1 + 0.2·64/100)
    assert float(adaptive.update(adaptive.init(), 0.3, 64).beta) == pytest.approx(
        0.2 * (1 + 0.2 * 0.64)
    )


def test_missing_batch_fields_raise():
    a = _arrays()
    with pytest.raises(ValueError, match=r"needs `batch\.ref_logp`"):
        cfg = AlgorithmConfig(kl=KLConfig(mode="loss", coef=0.1))
        batch = _batch(a)._replace(ref_logp=None)
        rl_loss(
            cfg,
            batch,
            count_normalizers(batch.completion_mask),
            logp=batch.old_logp,
            entropy=batch.old_logp,
        )


def test_rollout_correction_weights_the_policy_loss():
    """Truncated IS (TIS): w = min(π_old/π_rollout, 2) multiplies the per-token PPO loss."""
    cfg = AlgorithmConfig(
        policy_loss=PolicyLossConfig(agg="token_mean"),
        rollout_correction=RolloutCorrectionConfig(level="token", mode="truncate", high=2.0),
    )
    a = _arrays(seed=7)
    rng = np.random.default_rng(8)
    rollout = a["old"] + rng.uniform(-1.5, 1.5, (N, T))
    m = a["mask"]
    r = np.exp(a["logp"] - a["old"])
    per_token = np.maximum(-a["adv"] * r, -a["adv"] * np.clip(r, 0.8, 1.2))
    w = np.minimum(np.exp(a["old"] - rollout), 2.0)
    expected = (per_token * w * m).sum() / m.sum()
    batch = _batch(a)._replace(rollout_logp=jnp.asarray(rollout, jnp.float32), ref_logp=None)
    loss, _ = rl_loss(
        cfg,
        batch,
        count_normalizers(batch.completion_mask),
        logp=jnp.asarray(a["logp"], jnp.float32),
        entropy=jnp.zeros((N, T)),
    )
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    with pytest.raises(ValueError, match=r"needs `batch\.rollout_logp`"):
        rl_loss(
            cfg,
            batch._replace(rollout_logp=None),
            count_normalizers(batch.completion_mask),
            logp=batch.old_logp,
            entropy=jnp.zeros((N, T)),
        )


def test_seq_k1_averages_over_the_rows_that_have_tokens():
    """`kl/seq_k1` (the adaptive controller's input) is the mean over non-empty rows of each
    row's token-mean k1: a row DAPO or the reward guard emptied must not halve it. old − ref = 1
    on the one row with tokens → 1 (0.5 if the empty row counted)."""
    mask = jnp.array([[1.0, 1.0], [0.0, 0.0]])
    batch = RLBatch(
        jnp.zeros((2, 4), jnp.int32),
        jnp.ones((2, 4)),
        mask,
        advantages=jnp.zeros((2, 2)),
        old_logp=jnp.zeros((2, 2)),
        ref_logp=jnp.full((2, 2), -1.0),
    )
    config = AlgorithmConfig(kl=KLConfig(mode="loss", coef=0.1))
    _, metrics = rl_loss(
        config, batch, count_normalizers(mask), logp=jnp.zeros((2, 2)), entropy=jnp.zeros((2, 2))
    )
    assert float(metrics["kl/seq_k1"]) == pytest.approx(1.0)
