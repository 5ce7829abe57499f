"""Packed preference pairs (`PreferenceConfig.packing`, `jaxrl_llm.train.pair_packing`): the
layout against a hand-built oracle, the same log-probs, losses, gradients, reference
log-probs and updates as the padded forward (with accumulation micro-batches too), the
prefix-shared mask, and the refusals."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import losses
from jaxrl_llm.data import ArithmeticConfig, arithmetic_preference_records
from jaxrl_llm.models import Decoder
from jaxrl_llm.models.cache import full_attention_mask
from jaxrl_llm.tokenizer import ByteTokenizer
from jaxrl_llm.train import (
    OptimConfig,
    PreferenceConfig,
    SequenceBatch,
    completion_logprobs,
    concat_sequences,
    init_train_state,
    make_logprob_fn,
    make_optimizer,
    pack_pairs,
    pack_preference_batch,
    packed_pair_logprobs,
    preference_normalizers,
    preference_objective,
    prepare_preference_batch,
    split_models,
    train_preference,
    update_step,
)
from tests.extended import split_cases
from tests.train.helpers import tiny_policy, tiny_sliding_window_policy, tree_max_abs_diff
from tests.train.test_preference import VOCAB
from tests.train.test_preference_shared_prompt import (
    CASES,
    CORE_CASES,
    assert_same_loss_metrics_and_grads,
    objective_value_and_grad,
    setup_pairs,
)


def _setup():
    """A tiny policy and 8 arithmetic pairs of several lengths (one with a long rejected
    response, one padding pair), with reference log-probs and BCO's shift filled in."""
    return setup_pairs(8)


def _packed(batch, **kw):
    return batch._replace(
        packed=jax.tree.map(jnp.asarray, pack_pairs(batch.chosen, batch.rejected, **kw))
    )


def test_layout_matches_a_hand_built_oracle():
    """Two pairs of real lengths 2+1+2 and 1+2+1 in rows of 9 slots: one row, in index order;
    positions continue the prompt in both responses; slots point at the predicting state."""
    c = SequenceBatch(
        np.array([[3, 4, 5, 0], [0, 6, 7, 8]]),
        np.array([[1, 1, 1, 0], [0, 1, 1, 1]]),
        np.array([[1, 0], [1, 1]]),
    )
    r = SequenceBatch(
        np.array([[3, 4, 9, 9], [0, 6, 2, 0]]),
        np.array([[1, 1, 1, 1], [0, 1, 1, 0]]),
        np.array([[1, 1], [1, 0]]),
    )
    p = pack_pairs(c, r, length=9, pad_id=0)
    assert p.tokens.tolist() == [[3, 4, 5, 9, 9, 6, 7, 8, 2]]
    assert p.positions.tolist() == [[0, 1, 2, 2, 3, 0, 1, 2, 1]]
    assert p.segment_ids.tolist() == [[1, 1, 1, 1, 1, 2, 2, 2, 2]]
    assert p.roles.tolist() == [[0, 0, 1, 2, 2, 0, 1, 1, 2]]
    assert p.row.tolist() == p.batch_row.tolist() == [0, 0]
    # pair 0: chosen 5 ← slot 1 (prompt end); rejected 9 ← slot 1, second 9 ← slot 3
    # pair 1: chosen 7 ← slot 5, 8 ← slot 6; rejected 2 ← slot 5
    assert p.slots.tolist() == [[[1, 0], [1, 3]], [[5, 6], [5, 0]]]
    assert p.ends.tolist() == [[2, 4], [7, 8]]  # each sequence's last real token
    assert p.targets.tolist() == [[[5, 0], [9, 9]], [[7, 8], [2, 0]]]
    assert p.target_mask.tolist() == [[[1, 0], [1, 1]], [[1, 1], [1, 0]]]
    # length 5: one pair per row; the rows double up to a power of two (here 2 = N)
    assert pack_pairs(c, r, length=5).tokens.shape == (2, 5)


def test_micro_batches_get_rows_of_their_own():
    """parts = 2: pairs ≡ j (mod 2) go into rows ≡ j (mod 2), as the update step splits."""
    _, _, _, batch = _setup()
    p = pack_pairs(batch.chosen, batch.rejected, parts=2, length=40)
    R = p.tokens.shape[0]
    assert R % 2 == 0
    assert np.all(p.batch_row % 2 == np.arange(8) % 2)
    np.testing.assert_array_equal(p.batch_row, p.row * 2 + np.arange(8) % 2)
    segments = np.asarray(p.segment_ids)
    for n in range(8):  # each pair's tokens all in its row, under its segment
        c_real = int(np.sum(np.asarray(batch.chosen.attention_mask)[n]))
        r_real = int(np.sum(np.asarray(batch.rejected.attention_mask)[n]))
        P = batch.chosen.tokens.shape[1] - batch.chosen.completion_mask.shape[1]
        r_completion = r_real - int(np.sum(np.asarray(batch.rejected.attention_mask)[n, :P]))
        assert c_real + r_completion <= 40
    assert segments.max() >= 2  # pairs share rows


@pytest.mark.parametrize("family", ["qwen3", "gemma2"])
def test_packed_logprobs_equal_the_padded_forward(family):
    """Every completion token's log-prob, also with sliding-window layers (window 3: the
    positions must continue the prompt in both responses)."""
    if family == "qwen3":
        model = tiny_policy(3, vocab=VOCAB, layers=2)
    else:
        model = tiny_sliding_window_policy(3, vocab=VOCAB)
    _, _, _, batch = _setup()
    joint = concat_sequences(batch.chosen, batch.rejected)
    padded, _, _ = completion_logprobs(model, joint)
    N = batch.chosen.tokens.shape[0]
    for kw in ({}, {"length": 30}, {"parts": 2, "length": 40}):
        packed = _packed(batch, **kw).packed
        logp = packed_pair_logprobs(model, packed)
        T_c = batch.chosen.completion_mask.shape[1]
        np.testing.assert_allclose(logp[:, 0, :T_c], padded[:N, :T_c], atol=2e-5, err_msg=str(kw))
        np.testing.assert_allclose(logp[:, 1], padded[N:], atol=2e-5, err_msg=str(kw))
        assert float(jnp.min(padded)) < -1.0


def test_rejected_tokens_do_not_read_the_chosen_ones():
    model = tiny_policy(3, vocab=VOCAB, layers=2)
    _, _, _, batch = _setup()
    packed = _packed(batch).packed
    base = packed_pair_logprobs(model, packed)
    chosen_slots = np.asarray(packed.roles) == 1
    tokens = np.where(chosen_slots, (np.asarray(packed.tokens) + 5) % VOCAB, packed.tokens)
    moved = packed_pair_logprobs(model, packed._replace(tokens=jnp.asarray(tokens)))
    np.testing.assert_array_equal(moved[:, 1], base[:, 1])
    assert float(jnp.max(jnp.abs(moved[:, 0] - base[:, 0]))) > 1e-3


def test_role_mask_oracle():
    """Prompt (0), chosen (1), rejected (2) in one segment, then another segment."""
    segments = jnp.array([[1, 1, 1, 1, 2, 2]])
    roles = jnp.array([[0, 1, 2, 2, 0, 2]])
    positions = jnp.array([[0, 1, 1, 2, 0, 1]])
    mask = np.asarray(full_attention_mask(segments, positions, None, roles)).astype(int)
    expected = np.array(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0],
            [1, 0, 1, 1, 0, 0],
            [0, 0, 0, 0, 1, 0],
            [0, 0, 0, 0, 1, 1],
        ]
    )
    np.testing.assert_array_equal(mask[0], expected)


@pytest.mark.parametrize("name", split_cases(sorted(CASES), CORE_CASES))
def test_loss_metrics_and_gradients_equal_the_padded_forward(name):
    config = CASES[name]
    graphs, params, frozen, batch = _setup()
    packed = preference_objective(dataclasses.replace(config, packing=True), graphs)
    assert_same_loss_metrics_and_grads(
        objective_value_and_grad(packed, params, frozen, _packed(batch)),
        objective_value_and_grad(preference_objective(config, graphs), params, frozen, batch),
    )


def test_the_forward_runs_fewer_token_slots(monkeypatch):
    """The policy's forward gets the packed rows with their roles, fewer slots than the padded
    pairs (here under half of `2·N·(P + T)`)."""
    graphs, params, frozen, batch = _setup()
    calls = []
    original = Decoder.hidden_states

    def spy(self, tokens, positions, **kw):
        calls.append((tokens.shape, kw.get("segment_roles") is not None))
        return original(self, tokens, positions, **kw)

    monkeypatch.setattr(Decoder, "hidden_states", spy)
    config = PreferenceConfig(loss="dpo", packing=True)
    objective = preference_objective(config, graphs)
    packed = _packed(batch)
    objective.loss(params, frozen, packed, preference_normalizers(packed), 0.0)  # eager
    ((R, L), roles), *_ = calls
    assert roles
    padded = 2 * batch.chosen.tokens.size
    assert padded / 2 > R * L, (R, L, padded)


@pytest.mark.parametrize("loss", ["dpo", "bco"])
def test_prepared_reference_logprobs_and_bco_shift_equal_the_padded_forward(loss):
    graphs, params, frozen, batch = _setup()
    batch = batch._replace(ref_chosen_logp=None, ref_rejected_logp=None, reward_shift=None)
    ref = jax.tree.map(lambda x: x * 1.01, params["policy"])
    fn = make_logprob_fn(graphs.policy)
    out = {}
    for packing in (False, True):
        config = PreferenceConfig(loss=loss, packing=packing)
        moments = losses.init_running_moments() if loss == "bco" else None
        out[packing], _ = prepare_preference_batch(
            config,
            pack_preference_batch(config, batch, parts=2),
            logprob_fn=fn,
            policy_params=params["policy"],
            ref_params=ref,
            frozen=frozen["policy"],
            reward_moments=moments,
        )
    assert out[True].packed is not None and out[False].packed is None
    for field in ("ref_chosen_logp", "ref_rejected_logp", "reward_shift"):
        plain, packed = getattr(out[False], field), getattr(out[True], field)
        assert (plain is None) == (loss == "dpo" and field == "reward_shift")
        if plain is not None:
            np.testing.assert_allclose(packed, plain, rtol=1e-5, atol=2e-5, err_msg=field)


@pytest.mark.parametrize("steps", [1, 2])
def test_update_with_micro_batches_equals_the_padded_update(steps):
    """Accumulation over 2 micro-batches (and 2 unshuffled minibatches): each micro-batch
    reads its own packed rows; the parameters after the update equal the padded update's."""
    graphs, params, frozen, batch = _setup()
    config = PreferenceConfig(loss="dpo", beta=0.5, minibatches=steps, shuffle=False)
    optim = OptimConfig(name="sgd", learning_rate=0.5, accumulation_steps=2)
    tx = make_optimizer(optim)
    parts = config.minibatches * optim.accumulation_steps
    new = {}
    for packing in (False, True):
        cfg = dataclasses.replace(config, packing=packing)
        objective = preference_objective(cfg, graphs)
        state = init_train_state(params, frozen, tx, key=jax.random.key(0))
        b = _packed(batch, parts=parts, length=24) if packing else batch
        new[packing], metrics = jax.jit(
            functools.partial(
                update_step,
                objective=objective,
                optimizer=tx,
                minibatches=cfg.minibatches,
                accumulation_steps=2,
                shuffle=False,
            )
        )(state, b)
        assert np.isfinite(float(metrics["loss/total"]))
    assert tree_max_abs_diff(new[True].params, new[False].params) < 1e-5
    assert tree_max_abs_diff(new[False].params, params) > 1e-4


def test_micro_batch_rows_are_local():
    """Packed for 2 parts, pairs of micro-batch 1 sit in odd batch rows, row = batch_row // 2."""
    _, _, _, batch = _setup()
    p = pack_pairs(batch.chosen, batch.rejected, parts=2, length=24)
    np.testing.assert_array_equal(p.row, p.batch_row // 2)


def test_train_preference_with_packing_follows_the_padded_run():
    from tests.train.helpers import tiny_config

    records = arithmetic_preference_records(ArithmeticConfig(max_digits=2, train_size=8), seed=1)
    cfg = tiny_config(vocab=259, layers=1)
    history = {}
    for packing in (False, True):
        _, history[packing] = train_preference(
            Decoder(cfg, rngs=nnx.Rngs(0)),
            ByteTokenizer(),
            records,
            PreferenceConfig(loss="dpo", beta=0.5, packing=packing),
            OptimConfig(learning_rate=5e-3, accumulation_steps=2),
            steps=3,
            batch_size=4,
        )
    for a, b in zip(history[False], history[True], strict=True):
        np.testing.assert_allclose(b["loss/total"], a["loss/total"], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(b["pref/margin"], a["pref/margin"], rtol=1e-3, atol=1e-4)
    assert history[True][-1]["loss/total"] < history[True][0]["loss/total"]


def _pair(prompt_c, prompt_r, completion=(1, 2)):
    P, T = 3, 2

    def seq(prompt, comp):
        toks = np.zeros((1, P + T), int)
        mask = np.zeros((1, P + T), int)
        toks[0, P - len(prompt) : P], mask[0, P - len(prompt) : P] = prompt, 1
        toks[0, P : P + len(comp)], mask[0, P : P + len(comp)] = comp, 1
        cm = np.zeros((1, T))
        cm[0, : len(comp)] = 1
        return SequenceBatch(toks, mask, cm)

    return seq(prompt_c, completion), seq(prompt_r, completion)


def test_refusals_name_the_problem():
    c, r = _pair([5, 6], [5, 7])
    with pytest.raises(ValueError, match="pair 0's chosen and rejected rows hold different"):
        pack_pairs(c, r)
    c, r = _pair([5, 6], [5, 6])
    with pytest.raises(ValueError, match=r"`length` 4: .*length 6"):
        pack_pairs(c, r, length=4)
    with pytest.raises(ValueError, match="1 pairs do not split into `parts` = 2"):
        pack_pairs(c, r, parts=2)
    c, r = _pair([], [])
    with pytest.raises(ValueError, match="no prompt token"):
        pack_pairs(c, r)
    c, r = _pair([5], [5])
    bad = c._replace(completion_mask=np.ones((1, 2)), attention_mask=c.attention_mask * 0 + 1)
    bad = bad._replace(attention_mask=np.array([[0, 0, 1, 1, 0]]))
    with pytest.raises(ValueError, match="target on a padding slot"):
        pack_pairs(bad, r)
    batch = _setup()[3]
    with pytest.raises(ValueError, match="more than rows_per_part = 1"):
        pack_pairs(batch.chosen, batch.rejected, length=20, rows_per_part=1)


def test_config_refusals():
    with pytest.raises(ValueError, match="`packing` lays out preference pairs; loss 'kto'"):
        PreferenceConfig(loss="kto", packing=True)
    with pytest.raises(ValueError, match="set `shuffle: false`"):
        PreferenceConfig(packing=True, minibatches=2)
    with pytest.raises(ValueError, match="`packing_length` must be an int >= 2 with"):
        PreferenceConfig(packing_length=64)
    assert PreferenceConfig(packing=True, minibatches=2, shuffle=False).packing


def test_a_batch_whose_packing_does_not_match_is_refused():
    batch = _setup()[3]
    wrong = _packed(batch)
    wrong = wrong._replace(packed=wrong.packed._replace(slots=wrong.packed.slots[:, :, :1]))
    objective = preference_objective(PreferenceConfig(packing=True), _setup()[0])
    with pytest.raises(ValueError, match=r"`packed` must hold the N = 8 pairs"):
        objective.check(wrong, 1)


@pytest.mark.parametrize("section", ["preference", "reward_model"])
def test_a_runner_run_with_packing_trains_and_evaluates_as_without(tmp_path, section):
    """`preference.packing=true` (DPO) and `reward_model.packing=true` with 2 accumulation
    micro-batches: the same losses, metrics and held-out metrics as the padded run; the packed
    rows' fill is logged."""
    from jaxrl_llm.cli import main
    from tests.runner.helpers import CONFIGS, PREFERENCE, records

    config = CONFIGS / ("dpo.yaml" if section == "preference" else "reward_model.yaml")
    runs = {}
    for name, extra in (("plain", []), ("packed", [f"{section}.packing=true"])):
        overrides = [
            *PREFERENCE,
            "train.eval_every=2",
            "train.eval_prompts=4",
            "optim.accumulation_steps=2",
            *extra,
        ]
        run_dir = tmp_path / name
        assert main(["train", str(config), *overrides, "--run-dir", str(run_dir)]) == 0
        runs[name] = records(run_dir)
    ours, theirs = runs["packed"], runs["plain"]
    accuracy = "eval/pref/accuracy" if section == "preference" else "eval/rm/accuracy"
    assert len(ours) == len(theirs) and any(r.get(accuracy) is not None for r in ours)
    fills = [r["perf/packing_fill"] for r in ours if "perf/packing_fill" in r]
    assert fills and all(0.3 < f <= 1.0 for f in fills), fills
    for a, b in zip(ours, theirs, strict=True):
        for key, value in b.items():
            timing = key == "elapsed" or key.startswith(("time/", "perf/"))
            if isinstance(value, float) and not timing:
                np.testing.assert_allclose(a[key], value, rtol=1e-4, atol=1e-5, err_msg=key)


@functools.cache
def _reward_model():
    from jaxrl_llm.models import ValueModel
    from tests.train.helpers import tiny_config

    return split_models(ValueModel(tiny_config(vocab=VOCAB, layers=2), rngs=nnx.Rngs(4)))


def test_reward_model_scores_equal_the_padded_forward():
    from jaxrl_llm.models import ValueModel
    from jaxrl_llm.train import packed_pair_scores, sequence_scores
    from tests.train.helpers import tiny_config

    model = ValueModel(tiny_config(vocab=VOCAB, layers=2), rngs=nnx.Rngs(4))
    batch = _setup()[3]
    N = batch.chosen.tokens.shape[0]
    padded = sequence_scores(model, concat_sequences(batch.chosen, batch.rejected))
    for kw in ({}, {"parts": 2, "length": 40}):
        scores = packed_pair_scores(model, _packed(batch, **kw).packed)
        np.testing.assert_allclose(scores[:, 0], padded[:N], atol=2e-5, err_msg=str(kw))
        np.testing.assert_allclose(scores[:, 1], padded[N:], atol=2e-5, err_msg=str(kw))
    assert float(jnp.std(padded)) > 1e-3


def test_reward_model_loss_and_gradients_equal_the_padded_forward():
    from jaxrl_llm.train import RewardModelConfig, reward_model_objective

    graphs, params, frozen = _reward_model()
    batch = _setup()[3]
    results = [
        objective_value_and_grad(
            reward_model_objective(RewardModelConfig(center_coef=0.01, packing=packing), graphs),
            params,
            frozen,
            _packed(batch) if packing else batch,
        )
        for packing in (True, False)
    ]
    assert_same_loss_metrics_and_grads(*results)


def test_train_reward_model_with_packing_follows_the_padded_run():
    from jaxrl_llm.models import ValueModel
    from jaxrl_llm.train import RewardModelConfig, train_reward_model
    from tests.train.helpers import tiny_config

    records = arithmetic_preference_records(ArithmeticConfig(max_digits=2, train_size=8), seed=1)
    history = {}
    for packing in (False, True):
        _, history[packing] = train_reward_model(
            ValueModel(tiny_config(vocab=259, layers=1), rngs=nnx.Rngs(0)),
            ByteTokenizer(),
            records,
            RewardModelConfig(packing=packing),
            OptimConfig(learning_rate=5e-3, accumulation_steps=2),
            steps=3,
            batch_size=4,
        )
    for a, b in zip(history[False], history[True], strict=True):
        for key in ("loss/total", "rm/margin", "rm/chosen_mean"):
            np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-5, err_msg=key)
    assert history[True][-1]["loss/total"] < history[True][0]["loss/total"]


def test_reward_model_config_refusals():
    from jaxrl_llm.config import ConfigError
    from jaxrl_llm.train import RewardModelConfig

    with pytest.raises(ConfigError, match="set `shuffle: false`"):
        RewardModelConfig(packing=True, minibatches=2)
    with pytest.raises(ConfigError, match="`packing_length` must be an int >= 2 with"):
        RewardModelConfig(packing_length=64)


def test_the_precomputed_reference_table_equals_the_padded_one():
    from jaxrl_llm.data import PreferenceDataConfig, load_preference_data
    from jaxrl_llm.train import precompute_reference_logprobs

    graphs, params, frozen = split_models(tiny_policy(2, vocab=259, layers=1))
    records = arithmetic_preference_records(ArithmeticConfig(max_digits=3, train_size=7), seed=2)
    data = PreferenceDataConfig(bucket_minimum=4)
    examples, _, _ = load_preference_data(records, tokenizer=ByteTokenizer(), config=data)
    fn = make_logprob_fn(graphs.policy)
    tables = {}
    for packing in (False, True):
        tables[packing] = precompute_reference_logprobs(
            PreferenceConfig(loss="dpo", ld_alpha=0.5, packing=packing),
            examples,
            logprob_fn=fn,
            ref_params=params["policy"],
            frozen=frozen["policy"],
            pad_id=ByteTokenizer().pad_id,
            data_config=data,
            batch_size=3,
        )
    for plain, packed in zip(tables[False], tables[True], strict=True):
        np.testing.assert_allclose(packed, plain, rtol=1e-5, atol=2e-5)
        assert np.all(plain < 0)


def test_a_mesh_of_several_devices_keeps_the_padded_batch():
    """Packing needs the plain program: under a (here abstract) mesh of 2 devices the batch is
    left as it is and the forwards run the padded rows."""
    from jax.sharding import AbstractMesh

    batch = _setup()[3]
    config = PreferenceConfig(packing=True)
    with jax.sharding.use_abstract_mesh(AbstractMesh((2,), ("data",))):
        assert pack_preference_batch(config, batch).packed is None
    assert pack_preference_batch(config, batch).packed is not None
