"""Offline preference training: the objective against `losses`, accumulation, learning, configs."""

from __future__ import annotations

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import losses
from jaxrl_llm.config import build, load_yaml
from jaxrl_llm.data import (
    ArithmeticConfig,
    PreferenceDataConfig,
    TokenizedPreference,
    arithmetic_preference_records,
    load_preference_data,
    make_preference_batch,
)
from jaxrl_llm.models import positions_from_mask
from jaxrl_llm.tokenizer import ByteTokenizer
from jaxrl_llm.train import (
    OptimConfig,
    PreferenceBatch,
    PreferenceConfig,
    SequenceBatch,
    init_train_state,
    kto_kl_sequences,
    make_logprob_fn,
    make_optimizer,
    preference_loss,
    preference_normalizers,
    preference_objective,
    prepare_preference_batch,
    prompt_length,
    reference_logprobs,
    split_models,
    train_preference,
    update_step,
)
from tests.losses.helpers import plant_nonfinite
from tests.train.helpers import UPDATE_LAYERS, tiny_policy, tree_max_abs_diff

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"
TOKENIZER = ByteTokenizer()
VOCAB = TOKENIZER.vocab_size
N, T_C, T_R = 8, 5, 7
RTOL, ATOL = 1e-5, 1e-6


# ------------------------------------------------------------------ token-level inputs


def _mask(rng, n, t, *, empty_row):
    lengths = rng.integers(1, t + 1, size=n)
    m = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
    m[1] = 1.0  # a full row
    if empty_row:
        m[0] = 0.0  # a padding pair (no chosen token): leaves the loss and the normalisers
    return m


def token_inputs(seed=0):
    """Masks, token log-probs (NaN/inf outside the masks), reference sums, labels, z, δ."""
    rng = np.random.default_rng(seed)
    m_c = _mask(rng, N, T_C, empty_row=True)
    m_r = _mask(rng, N, T_R, empty_row=False)
    lp_c = plant_nonfinite(-rng.uniform(0.05, 3.0, (N, T_C)), m_c, rng)
    lp_r = plant_nonfinite(-rng.uniform(0.05, 3.0, (N, T_R)), m_r, rng)

    def seqs(m):
        S = 3 + m.shape[1]
        return SequenceBatch(jnp.zeros((N, S), jnp.int32), jnp.ones((N, S)), jnp.asarray(m))

    batch = PreferenceBatch(
        chosen=seqs(m_c),
        rejected=seqs(m_r),
        ref_chosen_logp=jnp.asarray(-rng.uniform(1.0, 8.0, N), jnp.float32),
        ref_rejected_logp=jnp.asarray(-rng.uniform(1.0, 8.0, N), jnp.float32),
    )
    labels = jnp.asarray((np.arange(N) % 3 != 0).astype(np.float32))
    z = jnp.full((N,), 0.3, jnp.float32)
    shift = jnp.full((N,), 0.05, jnp.float32)
    return batch, jnp.asarray(lp_c), jnp.asarray(lp_r), labels, z, shift


# independent references: masked sums / means / LD sums written here, then `losses.<loss>`


def _sum(lp, m):
    return jnp.sum(jnp.where(m > 0, lp, 0.0), axis=1)


def _mean(lp, m):
    return _sum(lp, m) / jnp.maximum(jnp.sum(m, axis=1), 1.0)


def _ld_sums(lp_c, m_c, lp_r, m_r, alpha):
    public = jnp.minimum(m_c.sum(1), m_r.sum(1))[:, None]

    def one(lp, m):
        w = jnp.where(jnp.cumsum(m, axis=1) <= public, 1.0, alpha)
        return jnp.sum(jnp.where(m > 0, lp * w, 0.0), axis=1)

    return one(lp_c, m_c), one(lp_r, m_r)


def _nll(lp, m, agg):
    lp = jnp.where(m > 0, lp, 0.0)
    if agg == "token_mean":
        return -jnp.sum(lp) / jnp.sum(m)
    rows = jnp.sum(m, axis=1) > 0
    per_row = -jnp.sum(lp, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)
    return jnp.sum(per_row) / jnp.sum(rows)


def _pairs(batch, lp_c, lp_r):
    m_c, m_r = batch.chosen.completion_mask, batch.rejected.completion_mask
    valid = ((m_c.sum(1) > 0) & (m_r.sum(1) > 0)).astype(jnp.float32)
    return m_c * valid[:, None], m_r * valid[:, None], valid


def ref_dpo(kw, *, lengths=False, ld=None):
    def fn(batch, lp_c, lp_r, labels, z, shift):
        m_c, m_r, v = _pairs(batch, lp_c, lp_r)
        if ld is None:
            pc, pr = _sum(lp_c, m_c), _sum(lp_r, m_r)
        else:
            pc, pr = _ld_sums(lp_c, m_c, lp_r, m_r, ld)
        extra = {"chosen_length": m_c.sum(1), "rejected_length": m_r.sum(1)} if lengths else {}
        refs = (
            (None, None)
            if kw.get("reference_free")
            else (batch.ref_chosen_logp, batch.ref_rejected_logp)
        )
        return losses.dpo_loss(pc, pr, *refs, valid=v, **kw, **extra)[0]

    return fn


def ref_rpo(fn_kw, coef, agg):
    def fn(batch, lp_c, lp_r, labels, z, shift):
        m_c, m_r, v = _pairs(batch, lp_c, lp_r)
        pref = losses.dpo_loss(
            _sum(lp_c, m_c),
            _sum(lp_r, m_r),
            batch.ref_chosen_logp,
            batch.ref_rejected_logp,
            valid=v,
            **fn_kw,
        )[0]
        return pref + coef * _nll(lp_c, m_c, agg)

    return fn


def ref_reference_free(loss_fn, kw, *, mean, coef=0.0, agg="token_mean"):
    def fn(batch, lp_c, lp_r, labels, z, shift):
        m_c, m_r, v = _pairs(batch, lp_c, lp_r)
        reduce = _mean if mean else _sum
        pref = loss_fn(reduce(lp_c, m_c), reduce(lp_r, m_r), valid=v, **kw)[0]
        return pref + (coef * _nll(lp_c, m_c, agg) if coef else 0.0)

    return fn


def ref_kto(kw, *, reads_z=True):
    def fn(batch, lp_c, lp_r, labels, z, shift):
        m = batch.chosen.completion_mask
        v = (m.sum(1) > 0).astype(jnp.float32)
        pi = _sum(lp_c, m)
        ref = batch.ref_chosen_logp
        return losses.kto_loss(
            pi,
            pi,
            ref,
            ref,
            kl=z[0] if reads_z else None,
            chosen_valid=v * labels,
            rejected_valid=v * (1 - labels),
            **kw,
        )[0]

    return fn


def ref_bco(batch, lp_c, lp_r, labels, z, shift):
    m_c, m_r, v = _pairs(batch, lp_c, lp_r)
    return losses.bco_loss(
        _sum(lp_c, m_c),
        _sum(lp_r, m_r),
        batch.ref_chosen_logp,
        batch.ref_rejected_logp,
        beta=0.2,
        delta=shift[0],
        chosen_valid=v,
        rejected_valid=v,
    )[0]


CASES = {
    "dpo": (PreferenceConfig(loss="dpo", beta=0.1), ref_dpo({"beta": 0.1})),
    "dpo_ipo_lengths": (
        PreferenceConfig(loss="dpo", beta=0.5, loss_type="ipo", normalize_by_length=True),
        ref_dpo({"beta": 0.5, "loss_type": "ipo"}, lengths=True),
    ),
    "dpo_mpo_weights": (
        PreferenceConfig(loss="dpo", loss_type=("sigmoid", "bco_pair"), loss_weights=(0.8, 0.2)),
        ref_dpo({"loss_type": ("sigmoid", "bco_pair"), "loss_weights": (0.8, 0.2)}),
    ),
    "dpo_robust_js": (
        PreferenceConfig(
            loss="dpo", loss_type="robust", label_smoothing=0.1, f_divergence="js_divergence"
        ),
        ref_dpo({"loss_type": "robust", "label_smoothing": 0.1, "f_divergence": "js_divergence"}),
    ),
    "dpo_reference_free": (
        PreferenceConfig(loss="dpo", reference_free=True),
        ref_dpo({"reference_free": True}),
    ),
    "dpo_ld": (PreferenceConfig(loss="dpo", ld_alpha=0.3), ref_dpo({}, ld=0.3)),
    "rpo": (
        PreferenceConfig(loss="rpo", beta=0.2, nll_coef=0.5, nll_agg="seq_mean_token_mean"),
        ref_rpo({"beta": 0.2}, 0.5, "seq_mean_token_mean"),
    ),
    "simpo": (
        PreferenceConfig(loss="simpo", beta=2.5, gamma=0.7),
        ref_reference_free(losses.simpo_loss, {"beta": 2.5, "gamma": 0.7}, mean=True),
    ),
    "cpo": (
        PreferenceConfig(loss="cpo", loss_type="hinge"),
        ref_reference_free(losses.cpo_loss, {"loss_type": "hinge"}, mean=False, coef=1.0),
    ),
    "orpo": (
        PreferenceConfig(loss="orpo", beta=0.3, nll_coef=2.0),
        ref_reference_free(losses.orpo_loss, {"beta": 0.3}, mean=True, coef=2.0),
    ),
    "kto": (
        PreferenceConfig(loss="kto", beta=0.2, desirable_weight=1.3),
        ref_kto({"beta": 0.2, "desirable_weight": 1.3}),
    ),
    "kto_apo_zero": (
        PreferenceConfig(loss="kto", loss_type="apo_zero_unpaired"),
        ref_kto({"loss_type": "apo_zero_unpaired"}, reads_z=False),
    ),
    "bco": (PreferenceConfig(loss="bco", beta=0.2), ref_bco),
}


def _unpaired(config, batch, labels, z):
    if config.paired:
        return batch
    fields = dict(rejected=None, ref_rejected_logp=None, labels=labels)
    if config.needs_reference_point:
        fields["kl_reference_point"] = z
    return batch._replace(**fields)


def _ours(config, batch, shift):
    if config.loss == "bco":
        batch = batch._replace(reward_shift=shift)

    def fn(lp_c, lp_r):
        lp_r = lp_r if config.paired else None
        return preference_loss(config, batch, lp_c, lp_r, preference_normalizers(batch))[0]

    return fn


@pytest.mark.parametrize("name", sorted(CASES))
def test_loss_and_gradients_equal_losses_on_independent_sequence_logprobs(name):
    config, reference = CASES[name]
    batch, lp_c, lp_r, labels, z, shift = token_inputs()
    batch = _unpaired(config, batch, labels, z)
    ours = jax.jit(jax.value_and_grad(_ours(config, batch, shift), argnums=(0, 1)))
    value, grads = ours(lp_c, lp_r)

    def theirs(lp_c, lp_r):
        return reference(batch, lp_c, lp_r, labels, z, shift)

    expected, expected_grads = jax.jit(jax.value_and_grad(theirs, argnums=(0, 1)))(lp_c, lp_r)
    np.testing.assert_allclose(value, expected, rtol=RTOL, atol=ATOL)
    assert np.isfinite(float(value))
    for g, e in zip(grads, expected_grads, strict=True):
        assert np.all(np.isfinite(np.asarray(g)))  # NaN/inf planted outside the masks stay out
        np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL)
    m_c = np.asarray(batch.chosen.completion_mask)
    assert np.all(np.asarray(grads[0])[m_c == 0] == 0)
    assert np.all(np.asarray(grads[0])[0] == 0)  # the padding pair gets no gradient


@pytest.mark.parametrize("name", ["bco", "dpo_mpo_weights", "kto", "orpo", "rpo"])
def test_micro_batches_add_up_to_the_full_batch(name):
    """k parts with the update's global normalisers: Σ losses and Σ gradients = the full batch."""
    config, _ = CASES[name]
    batch, lp_c, lp_r, labels, z, shift = token_inputs(seed=1)
    batch = _unpaired(config, batch, labels, z)
    if config.loss == "bco":
        batch = batch._replace(reward_shift=shift)
    norms = preference_normalizers(batch)

    def loss(lp_c, lp_r, b=batch):
        return preference_loss(config, b, lp_c, lp_r if config.paired else None, norms)[0]

    full, full_grads = jax.value_and_grad(loss, argnums=(0, 1))(lp_c, lp_r)
    k = 4
    total, grads = 0.0, [np.zeros(lp_c.shape), np.zeros(lp_r.shape)]
    for i in range(k):
        rows = np.arange(i, N, k)
        part = jax.tree.map(lambda x, r=rows: x[r], batch)
        value, (g_c, g_r) = jax.value_and_grad(loss, argnums=(0, 1))(lp_c[rows], lp_r[rows], part)
        total += float(value)
        grads[0][rows] += np.asarray(g_c)
        grads[1][rows] += np.asarray(g_r)
    np.testing.assert_allclose(total, full, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(grads[0], full_grads[0], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(grads[1], full_grads[1], rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------- real tiny model


def _records_batch(records, unpaired=False):
    cfg = PreferenceDataConfig(bucket_minimum=4)
    examples, _, _ = load_preference_data(
        records, tokenizer=TOKENIZER, config=cfg, unpaired=unpaired
    )
    return make_preference_batch(examples, pad_id=TOKENIZER.pad_id, config=cfg)


PAIRS = [
    {"prompt": "12+7=", "chosen": "19", "rejected": "18"},
    {"prompt": "3+4=", "chosen": "7", "rejected": "107"},
    {"prompt": "40+2=", "chosen": "42", "rejected": "4"},
    {"prompt": "1+1=", "chosen": "2", "rejected": "3"},
]


def _full_logits_seq_logp(model, seqs, reduce="sum"):
    """Sequence log-probs from the full `[N,S,V]` logits (no chunking, no concatenation)."""
    mask = seqs.attention_mask
    logits = model(seqs.tokens, positions_from_mask(mask), attention_mask=mask)
    T = seqs.completion_mask.shape[1]
    P = seqs.tokens.shape[1] - T
    lp = losses.token_logprobs(logits[:, P - 1 : P - 1 + T], seqs.tokens[:, P:])
    return (_mean if reduce == "mean" else _sum)(lp, seqs.completion_mask)


def test_objective_equals_dpo_on_separate_full_logit_forwards():
    """One concatenated forward (chosen and rejected of different P and T, padded and split) =
    separate full-logit forwards of chosen and rejected + `losses.dpo_loss`: values, gradients."""
    config = PreferenceConfig(loss="dpo", beta=0.5)
    graphs, params, frozen = split_models(tiny_policy(4, vocab=VOCAB, layers=UPDATE_LAYERS))
    batch = jax.tree.map(jnp.asarray, _records_batch(PAIRS))
    longer = [{**p, "prompt": "0" * 9 + p["prompt"], "rejected": p["rejected"] * 9} for p in PAIRS]
    batch = batch._replace(rejected=jax.tree.map(jnp.asarray, _records_batch(longer).rejected))
    assert prompt_length(batch.rejected) > prompt_length(batch.chosen)
    assert batch.rejected.completion_mask.shape[1] > batch.chosen.completion_mask.shape[1]
    rng = np.random.default_rng(0)
    batch = batch._replace(
        ref_chosen_logp=jnp.asarray(-rng.uniform(5, 15, 4), jnp.float32),
        ref_rejected_logp=jnp.asarray(-rng.uniform(5, 15, 4), jnp.float32),
    )
    objective = preference_objective(config, graphs)
    norms = preference_normalizers(batch)

    def ours(p):
        return objective.loss(p, frozen, batch, norms, 0.0)[0]

    def theirs(p):
        model = nnx.merge(graphs.policy, p["policy"], frozen["policy"])
        pc = _full_logits_seq_logp(model, batch.chosen)
        pr = _full_logits_seq_logp(model, batch.rejected)
        return losses.dpo_loss(pc, pr, batch.ref_chosen_logp, batch.ref_rejected_logp, beta=0.5)[0]

    value, grads = jax.jit(jax.value_and_grad(ours))(params)
    expected, expected_grads = jax.jit(jax.value_and_grad(theirs))(params)
    np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-6)
    assert tree_max_abs_diff(grads, expected_grads) < 1e-5
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads)) > 0


def test_accumulation_in_the_update_step_equals_the_full_batch():
    """4 micro-batches (optax.MultiSteps) in `update_step` = one SGD step on the full batch's
    gradient (RPO: the pair mean and the chosen-token NLL both use global counts)."""
    config = PreferenceConfig(loss="rpo", beta=0.5, nll_coef=0.7)
    records = arithmetic_preference_records(ArithmeticConfig(max_digits=2, train_size=8), seed=3)
    rng = np.random.default_rng(3)
    batch = jax.tree.map(jnp.asarray, _records_batch(records))
    batch = batch._replace(
        ref_chosen_logp=jnp.asarray(-rng.uniform(5, 15, 8), jnp.float32),
        ref_rejected_logp=jnp.asarray(-rng.uniform(5, 15, 8), jnp.float32),
    )
    batch = batch._replace(  # a padding pair: it leaves the loss and the counts
        rejected=batch.rejected._replace(
            completion_mask=batch.rejected.completion_mask.at[5].set(0.0)
        )
    )
    graphs, params, frozen = split_models(tiny_policy(5, vocab=VOCAB, layers=UPDATE_LAYERS))
    objective = preference_objective(config, graphs)
    norms = preference_normalizers(batch)
    assert float(norms.num_seqs) == 7

    def full_loss(p):
        return objective.loss(p, frozen, batch, norms, 0.0)[0]

    loss, grads = jax.jit(jax.value_and_grad(full_loss))(params)
    lr = 0.5
    expected = jax.tree.map(lambda p, g: np.asarray(p) - lr * np.asarray(g), params, grads)
    tx = make_optimizer(
        OptimConfig(name="sgd", learning_rate=lr, max_grad_norm=None, accumulation_steps=4)
    )
    state = init_train_state(params, frozen, tx, key=jax.random.key(0))
    step = jax.jit(
        functools.partial(update_step, objective=objective, optimizer=tx, accumulation_steps=4)
    )
    state, metrics = step(state, batch)
    assert tree_max_abs_diff(state.params, expected) < 1e-5
    np.testing.assert_allclose(metrics["loss/total"], loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss/preference"] + metrics["loss/nll"], loss, rtol=1e-5)
    assert tree_max_abs_diff(state.params, params) > 1e-4


# ---------------------------------------------------------------- preparation


def test_kto_mismatched_pairs_are_the_previous_examples_completion():
    recs = [{"prompt": p["prompt"], "completion": p["chosen"], "label": True} for p in PAIRS]
    batch = _records_batch(recs, unpaired=True)
    rolled = [{**r, "completion": recs[i - 1]["completion"]} for i, r in enumerate(recs)]
    expected = _records_batch(rolled, unpaired=True).chosen
    got = kto_kl_sequences(batch.chosen)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_prepare_fills_reference_point_and_bco_shift_from_independent_forwards():
    policy = tiny_policy(6, vocab=VOCAB, layers=UPDATE_LAYERS)
    graphs, params, frozen = split_models(policy)
    ref = jax.tree.map(lambda x: x * 1.1, params["policy"])
    fn = make_logprob_fn(graphs.policy)

    @jax.jit
    def full(p, seqs):  # sequence log-prob sums from the full logits
        return _full_logits_seq_logp(nnx.merge(graphs.policy, p, frozen["policy"]), seqs)

    kw = dict(
        logprob_fn=fn, policy_params=params["policy"], ref_params=ref, frozen=frozen["policy"]
    )

    recs = [
        {"prompt": p["prompt"], "completion": p["chosen"], "label": i < 2}
        for i, p in enumerate(PAIRS)
    ]
    batch, _ = prepare_preference_batch(
        PreferenceConfig(loss="kto"), _records_batch(recs, unpaired=True), **kw
    )
    kl = kto_kl_sequences(batch.chosen)
    d = full(params["policy"], kl) - full(ref, kl)
    np.testing.assert_allclose(batch.kl_reference_point, max(float(jnp.mean(d)), 0.0), atol=1e-5)
    np.testing.assert_allclose(batch.ref_chosen_logp, full(ref, batch.chosen), rtol=1e-5, atol=1e-5)

    config = PreferenceConfig(loss="bco", beta=0.3)
    moments = losses.init_running_moments()
    pairs = _records_batch(PAIRS)
    rewards = []
    for _ in range(2):
        prepared, moments = prepare_preference_batch(config, pairs, reward_moments=moments, **kw)
        for side in ("chosen", "rejected"):
            seqs = getattr(prepared, side)
            r = full(params["policy"], seqs) - full(ref, seqs)
            rewards.append(0.3 * np.asarray(r))
        np.testing.assert_allclose(
            prepared.reward_shift, np.mean(np.concatenate(rewards)), atol=1e-5
        )
    assert float(moments.count) == 16
    with pytest.raises(ValueError, match="needs `reward_moments`"):
        prepare_preference_batch(config, pairs, **kw)


# ---------------------------------------------------------------- learning


def _margin(model, batch):
    """Mean policy log-prob margin log π(chosen) − log π(rejected) of a batch."""
    graphs, params, frozen = split_models(model)
    c, r = reference_logprobs(
        make_logprob_fn(graphs.policy), params["policy"], frozen["policy"], batch
    )
    return float(jnp.mean(c - r))


def test_dpo_learns_to_prefer_the_correct_answers():
    records = arithmetic_preference_records(ArithmeticConfig(max_digits=1, train_size=16), seed=0)
    batch = _records_batch(records)
    policy = tiny_policy(7, vocab=VOCAB, layers=UPDATE_LAYERS)
    before = _margin(policy, batch)
    optim = OptimConfig(name="adamw", learning_rate=3e-3, max_grad_norm=1.0)
    model, history = train_preference(
        policy,
        TOKENIZER,
        records,
        PreferenceConfig(loss="dpo", beta=0.5),
        optim,
        steps=30,
        batch_size=16,
        seed=0,
        data_config=PreferenceDataConfig(bucket_minimum=4),
    )
    after = _margin(model, batch)
    first, last = history[0], history[-1]
    assert first["pref/accuracy"] <= 0.75 and last["pref/accuracy"] == 1.0, (first, last)
    assert last["pref/margin"] > first["pref/margin"] + 1.0
    assert last["loss/total"] < 0.5 * first["loss/total"]
    assert after > before + 2.0 / 0.5, (before, after)  # margin / β: the implicit reward gap
    assert {"pref/reward_chosen", "pref/reward_rejected", "optim/grad_norm"} <= set(last)


@pytest.mark.parametrize("loss", ["simpo", "orpo", "kto"])
def test_simpo_orpo_kto_train_and_lower_their_loss(loss):
    unpaired = loss == "kto"
    records = arithmetic_preference_records(
        ArithmeticConfig(max_digits=1, train_size=16), seed=1, unpaired=unpaired
    )
    assert not unpaired or {r["label"] for r in records} == {True, False}
    config = build(PreferenceConfig, load_yaml(CONFIGS / f"{loss}.yaml")["preference"])
    if loss == "kto":
        config = PreferenceConfig(loss="kto", beta=0.5)  # a stronger β for a 10-step test
    model, history = train_preference(
        tiny_policy(8, vocab=VOCAB, layers=UPDATE_LAYERS),
        TOKENIZER,
        records,
        config,
        OptimConfig(name="adamw", learning_rate=3e-3),
        steps=10,
        batch_size=16,
        data_config=PreferenceDataConfig(bucket_minimum=4),
    )
    totals = [h["loss/total"] for h in history]
    assert all(np.isfinite(v) for h in history for v in h.values())
    assert totals[-1] < 0.8 * totals[0], totals
    assert "pref/accuracy" in history[-1]
    assert isinstance(model, nnx.Module)


def test_a_lora_policy_trains_its_adapters_alone_when_asked():
    from jaxrl_llm.models import LORA_PATTERN, LoRAConfig, add_lora

    records = arithmetic_preference_records(ArithmeticConfig(max_digits=1, train_size=8), seed=2)
    policy = add_lora(
        tiny_policy(9, vocab=VOCAB, layers=UPDATE_LAYERS), LoRAConfig(rank=2), rngs=nnx.Rngs(1)
    )
    before = jax.tree.map(np.array, nnx.to_pure_dict(nnx.state(policy, nnx.Param)))
    model, _ = train_preference(
        policy, TOKENIZER, records, PreferenceConfig(loss="dpo"),
        OptimConfig(name="adamw", learning_rate=1e-2, weight_decay=0.1),
        steps=2, batch_size=4, data_config=PreferenceDataConfig(bucket_minimum=4),
        trainable=(LORA_PATTERN,),
    )  # fmt: skip
    after = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    flat_before = dict(jax.tree_util.tree_flatten_with_path(before)[0])
    moved = {
        jax.tree_util.keystr(path): bool(np.any(np.asarray(value) != flat_before[path]))
        for path, value in jax.tree_util.tree_flatten_with_path(after)[0]
    }
    adapters = {k: v for k, v in moved.items() if "_lora_" in k}
    assert adapters and all(adapters[k] for k in adapters if "_lora_b" in k), adapters
    assert not any(v for k, v in moved.items() if "_lora_" not in k)  # base bit-identical


# ---------------------------------------------------------------- configs and errors


@pytest.mark.parametrize("name", ["dpo", "simpo", "orpo", "kto"])
def test_yaml_configs_load(name):
    data = load_yaml(CONFIGS / f"{name}.yaml")
    assert {"preference", "optim"} <= set(data)
    config = build(PreferenceConfig, data["preference"], path="preference")
    assert config.loss == name
    build(OptimConfig, data["optim"], path="optim")


@pytest.mark.parametrize(
    "data, message",
    [
        ({"loss": "simpo", "nll_coef": 1.0}, "`nll_coef` is not used by loss 'simpo'"),
        ({"loss": "dpo", "gamma": 0.5}, "`gamma` is not used by loss 'dpo'"),
        ({"loss": "orpo", "reference_free": True}, "`reference_free` is not used"),
        ({"loss": "dpo", "loss_type": "sigmoidd"}, "`loss_type` must be one of sigmoid"),
        ({"loss": "kto", "loss_type": "sigmoid"}, "must be one of kto, apo_zero_unpaired"),
        ({"loss": "dpo", "loss_weights": [1.0]}, "`loss_weights` needs a list `loss_type`"),
        ({"loss": "dpo", "normalize_by_length": True}, "read only by loss types ipo"),
        ({"loss": "dpo", "loss_type": "exo_pair"}, r"label_smoothing` must lie in \(0, 1\)"),
        ({"loss": "dpo", "beta": -1.0}, "`beta` must be > 0"),
        ({"loss": "rpo", "nll_agg": "mean"}, "nll_agg: must be one of"),
        ({"loss": "orpo", "nll_agg": "seq_mean_token_sum_norm"}, "the batch's padded width"),
        ({"loss": "dpo", "ld_alpha": 1.5}, r"`ld_alpha` must lie in \[0, 1\]"),
        ({"loss": "dpo", "epochs": 0}, "`epochs` must be an int >= 1"),
        ({"loss": "ppo"}, "must be one of 'dpo'"),
    ],
)
def test_bad_configs_raise_naming_the_option(data, message):
    with pytest.raises(ValueError, match=message):
        build(PreferenceConfig, data)


def test_batch_errors_name_the_field():
    batch, *_ = token_inputs()
    objective = preference_objective(PreferenceConfig(), split_models(tiny_policy(layers=1))[0])
    with pytest.raises(ValueError, match="needs `ref_rejected_logp`"):
        objective.check(batch._replace(ref_rejected_logp=None), 1)
    with pytest.raises(
        ValueError, match=r"`ref_chosen_logp` must be a floating array of shape \(8,\)"
    ):
        objective.check(batch._replace(ref_chosen_logp=jnp.zeros((8, 1))), 1)
    with pytest.raises(ValueError, match="needs `rejected` sequences"):
        objective.check(batch._replace(rejected=None), 1)
    with pytest.raises(ValueError, match="expected a PreferenceBatch"):
        objective.check(batch.chosen, 1)
    kto = preference_objective(PreferenceConfig(loss="kto"), split_models(tiny_policy(layers=1))[0])
    with pytest.raises(ValueError, match="`rejected` must be None"):
        kto.check(batch._replace(labels=jnp.ones(N), kl_reference_point=jnp.zeros(N)), 1)
    with pytest.raises(ValueError, match="needs `labels`"):
        kto.check(batch._replace(rejected=None), 1)
    with pytest.raises(ValueError, match="at least 2 rows"):
        one = make_preference_batch(
            [TokenizedPreference((257, 49), (50,), None, True)],
            pad_id=0,
            config=PreferenceDataConfig(bucket_minimum=2),
        )
        prepare_preference_batch(
            PreferenceConfig(loss="kto"),
            one,
            logprob_fn=lambda p, f, s: jnp.zeros(s.completion_mask.shape),
            policy_params=None,
            ref_params=None,
            frozen=None,
        )
    with pytest.raises(ValueError, match="`steps` must be a positive int"):
        train_preference(
            tiny_policy(layers=1),
            TOKENIZER,
            PAIRS,
            PreferenceConfig(),
            OptimConfig(),
            steps=0,
            batch_size=2,
        )
