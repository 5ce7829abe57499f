"""compute_advantages / build_rl_batch against float64 NumPy references of the formulas."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.train import (
    AdvantageConfig,
    AlgorithmConfig,
    KLConfig,
    build_rl_batch,
    compute_advantages,
    preset,
)

B, G, T = 3, 4, 5
N = B * G


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, T + 1, N)
    lengths[0] = T
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float64)
    rewards = rng.integers(0, 3, N).astype(np.float64) / 2
    rewards[G : 2 * G] = 0.5  # one zero-variance group
    old = -rng.uniform(0.1, 2.0, (N, T))
    ref = -rng.uniform(0.1, 2.0, (N, T))
    values = rng.normal(size=(N, T))
    return mask, rewards, old, ref, values


def _f32(x):
    return jnp.asarray(x, jnp.float32)


def _whiten(x, m):
    mu = (x * m).sum() / m.sum()
    var = (((x - mu) * m) ** 2).sum() / (m.sum() - 1)
    return (x - mu) / np.sqrt(var + 1e-8) * m


def test_grpo_group_normalised_advantages():
    mask, s, *_ = _inputs()
    out = compute_advantages(preset("grpo"), _f32(s), _f32(mask), group_size=G)
    g = s.reshape(B, G)
    a = (g - g.mean(1, keepdims=True)) / (g.std(1, ddof=1, keepdims=True) + 1e-6)
    a[1] = 0.0  # zero-variance group: exactly 0
    np.testing.assert_allclose(out.advantages, a.reshape(N, 1) * mask, rtol=1e-5, atol=1e-6)
    assert out.keep.all() and out.returns is None


def test_rloo_with_kl_in_the_sequence_reward():
    mask, s, old, ref, _ = _inputs(1)
    cfg = dataclasses.replace(preset("rloo"), kl=KLConfig(mode="reward", coef=0.05))
    out = compute_advantages(
        cfg, _f32(s), _f32(mask), group_size=G, old_logp=_f32(old), ref_logp=_f32(ref), kl_coef=0.05
    )
    scores = (s - 0.05 * ((old - ref) * mask).sum(1)).reshape(B, G)
    a = G / (G - 1) * (scores - scores.mean(1, keepdims=True))
    np.testing.assert_allclose(out.advantages, a.reshape(N, 1) * mask, rtol=1e-5, atol=1e-5)


NP_KL = {  # the estimators at d = old − ref, float64
    "k1": lambda d: d,
    "k2": lambda d: 0.5 * d**2,
    "k3": lambda d: np.expm1(-d) + d,
    "abs": np.abs,
}


def _token_rewards(s, old, ref, mask, beta, estimator="k1"):
    r = -beta * NP_KL[estimator](old - ref) * mask
    last = mask.sum(1).astype(int) - 1
    r[np.arange(N), last] += s
    return r


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "abs"])
def test_reinforce_pp_whitened_discounted_returns_with_kl_reward(estimator):
    """The KL in the reward uses the configured estimator (k1 is the default, so a run that
    asked for k2 and got k1 would go unnoticed with k1 alone)."""
    mask, s, old, ref, _ = _inputs(2)
    beta, gamma = 0.1, 0.9
    cfg = dataclasses.replace(
        preset("reinforce_pp"),
        advantage=AdvantageConfig(estimator="reinforce_pp", gamma=gamma),
        kl=KLConfig(mode="reward", coef=beta, estimator=estimator),
    )
    out = compute_advantages(
        cfg, _f32(s), _f32(mask), group_size=G, old_logp=_f32(old), ref_logp=_f32(ref), kl_coef=beta
    )
    r = _token_rewards(s, old, ref, mask, beta, estimator)
    ret = np.zeros_like(r)
    for n in range(N):
        acc = 0.0
        for t in reversed(range(T)):
            if mask[n, t]:
                acc = r[n, t] + gamma * acc
                ret[n, t] = acc
    np.testing.assert_allclose(out.advantages, _whiten(ret, mask), rtol=1e-4, atol=1e-5)


def test_gae_with_kl_reward_and_whitening_and_explained_variance():
    mask, s, old, ref, values = _inputs(3)
    beta, lam = 0.05, 0.95
    cfg = preset("ppo")
    out = compute_advantages(
        cfg,
        _f32(s),
        _f32(mask),
        group_size=G,
        old_logp=_f32(old),
        ref_logp=_f32(ref),
        values=_f32(values * mask),
        kl_coef=beta,
    )
    r = _token_rewards(s, old, ref, mask, beta)
    v = values * mask
    adv = np.zeros_like(r)
    for n in range(N):
        last, nv = 0.0, 0.0
        for t in reversed(range(T)):
            if mask[n, t]:
                delta = r[n, t] + nv - v[n, t]
                last = delta + lam * last
                nv = v[n, t]
                adv[n, t] = last
    ret = (adv + v) * mask
    np.testing.assert_allclose(out.returns, ret, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.advantages, _whiten(adv, mask), rtol=1e-4, atol=1e-5)
    valid = mask > 0
    ev = 1 - np.var((ret - v)[valid], ddof=1) / np.var(ret[valid], ddof=1)
    np.testing.assert_allclose(float(out.metrics["value/explained_var"]), ev, rtol=1e-4)


def test_reinforce_pp_baseline_whitens_group_centred_scores_over_tokens():
    mask, s, *_ = _inputs(4)
    out = compute_advantages(preset("reinforce_pp_baseline"), _f32(s), _f32(mask), group_size=G)
    g = s.reshape(B, G)
    b = (g - g.mean(1, keepdims=True)).reshape(N, 1) * mask
    np.testing.assert_allclose(out.advantages, _whiten(b, mask), rtol=1e-4, atol=1e-5)


def test_dapo_drops_zero_variance_groups_from_the_batch():
    mask, s, old, *_ = _inputs(5)
    batch, metrics = build_rl_batch(
        preset("dapo"),
        tokens=jnp.ones((N, 3 + T), jnp.int32),
        attention_mask=jnp.ones((N, 3 + T), jnp.int32),
        completion_mask=_f32(mask),
        rewards=_f32(s),
        group_size=G,
        old_logp=_f32(old),
        ref_logp=_f32(old),
    )
    spread = s.reshape(B, G).max(1) > s.reshape(B, G).min(1)
    keep = np.repeat(spread, G)
    np.testing.assert_array_equal(batch.completion_mask, mask * keep[:, None])
    np.testing.assert_array_equal(np.asarray(batch.advantages)[~keep], 0.0)
    assert batch.ref_logp is None  # DAPO has no KL: the field is left out
    assert float(metrics["adv/kept_frac"]) == pytest.approx(keep.mean())
    assert float(metrics["adv/frac_zero_std"]) == pytest.approx(1 - spread.mean())


@pytest.mark.parametrize("estimator", ["whiten", "batch_std", "reinforce_pp_baseline"])
def test_dropped_groups_leave_the_batch_statistics(estimator):
    # the kept rows' advantages are those of a batch without the dropped groups, as with
    # DAPO's dynamic sampling (groups filtered before the batch is formed)
    mask, s, *_ = _inputs(6)
    base = preset("reinforce_pp_baseline" if estimator == "reinforce_pp_baseline" else "grpo")
    advantage = dataclasses.replace(
        base.advantage,
        drop_zero_variance=True,
        whiten=estimator == "whiten",
        scale="batch" if estimator == "batch_std" else base.advantage.scale,
    )
    cfg = dataclasses.replace(base, advantage=advantage)
    out = compute_advantages(cfg, _f32(s), _f32(mask), group_size=G)
    g = s.reshape(B, G)
    keep = np.repeat(g.max(1) > g.min(1), G)
    assert not keep.all() and keep.any()
    gk, mk = s[keep].reshape(-1, G), mask[keep]
    centred = gk - gk.mean(1, keepdims=True)
    if estimator == "batch_std":
        ref = centred / (s[keep].std(ddof=1) + 1e-6)
        ref = ref.reshape(-1, 1) * mk
    elif estimator == "whiten":
        ref = centred / (gk.std(1, ddof=1, keepdims=True) + 1e-6)
        ref = _whiten(ref.reshape(-1, 1) * mk, mk)
    else:
        ref = _whiten(centred.reshape(-1, 1) * mk, mk)
    np.testing.assert_allclose(np.asarray(out.advantages)[keep], ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(out.advantages)[~keep], 0.0)


def test_a_group_the_reward_guard_dropped_enters_no_statistic():
    """`on_failure: drop_group` zeroes the group's completion mask but leaves its filler reward:
    that reward entered the batch std of `scale: batch` (changing every other group's
    advantages), `adv/reward_*` and `adv/frac_zero_std` (hiding the warning that every group
    trained on has equal rewards)."""
    mask, s, *_ = _inputs(7)
    s[G : 2 * G] = 1.0  # the group trained on: equal rewards
    s[2 * G :] = [0.0, 1.0, 0.5, 0.5]
    s[:G] = [0.0, 0.0, 0.0, 1.0]  # the dropped group: filler and partial rewards
    dropped = np.zeros(N, bool)
    dropped[:G] = True
    mask[dropped] = 0.0
    grpo = preset("grpo")
    batch_std = dataclasses.replace(
        grpo, advantage=dataclasses.replace(grpo.advantage, scale="batch")
    )
    out = compute_advantages(batch_std, _f32(s), _f32(mask), group_size=G)
    live = s[~dropped].reshape(-1, G)
    ref = (live - live.mean(1, keepdims=True)) / (s[~dropped].std(ddof=1) + 1e-6)
    np.testing.assert_allclose(
        np.asarray(out.advantages)[~dropped], ref.reshape(-1, 1) * mask[~dropped], rtol=1e-5
    )
    np.testing.assert_array_equal(np.asarray(out.advantages)[dropped], 0.0)
    m = out.metrics
    assert float(m["adv/reward_mean"]) == pytest.approx(s[~dropped].mean())
    assert float(m["adv/reward_std"]) == pytest.approx(s[~dropped].std(ddof=1), rel=1e-5)
    assert float(m["adv/frac_zero_std"]) == pytest.approx(2 / 3)  # the dropped one counts too
    dapo = compute_advantages(preset("dapo"), _f32(s), _f32(mask), group_size=G)
    assert float(dapo.metrics["adv/kept_frac"]) == pytest.approx(1 / 3)  # only the spread group


def test_input_errors():
    mask, s, *_ = _inputs()
    with pytest.raises(ValueError, match="needs group_size >= 2"):
        compute_advantages(preset("grpo"), _f32(s), _f32(mask), group_size=1)
    with pytest.raises(ValueError, match="not whole groups"):
        compute_advantages(preset("grpo"), _f32(s), _f32(mask), group_size=5)
    with pytest.raises(ValueError, match="needs `old_logp` and `ref_logp`"):
        compute_advantages(preset("reinforce_pp"), _f32(s), _f32(mask), group_size=G)
    with pytest.raises(ValueError, match="needs the old critic `values`"):
        compute_advantages(
            preset("ppo"),
            _f32(s),
            _f32(mask),
            group_size=G,
            old_logp=_f32(mask),
            ref_logp=_f32(mask),
        )
    with pytest.raises(ValueError, match=r"`rewards` must be a float array \[N\]"):
        compute_advantages(AlgorithmConfig(), _f32(s[:-1]), _f32(mask), group_size=G)
