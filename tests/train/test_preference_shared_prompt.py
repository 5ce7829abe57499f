"""Preference forwards with each pair's prompt run once (`PreferenceConfig.shared_prompt`): the
same losses, gradients, reference log-probs and updates as the concatenated forward, on one
device with and without a mesh; the runner turns it on for paired losses."""

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
from jaxrl_llm.train import (
    OptimConfig,
    PreferenceBatch,
    PreferenceConfig,
    SequenceBatch,
    init_train_state,
    interleave_pairs,
    joint_token_logprobs,
    make_logprob_fn,
    make_optimizer,
    preference_normalizers,
    preference_objective,
    prepare_preference_batch,
    split_models,
    update_step,
)
from sharding import MeshConfig, make_mesh
from tests.extended import split_cases
from tests.train.helpers import tiny_policy, tree_max_abs_diff
from tests.train.test_preference import VOCAB, _records_batch

CASES = {
    "dpo": PreferenceConfig(loss="dpo", beta=0.5),
    "dpo_ld": PreferenceConfig(loss="dpo", ld_alpha=0.3),
    "rpo": PreferenceConfig(loss="rpo", beta=0.2, nll_coef=0.5, nll_agg="seq_mean_token_mean"),
    "simpo": PreferenceConfig(loss="simpo", beta=2.5, gamma=0.7),
    "cpo": PreferenceConfig(loss="cpo", loss_type="hinge"),
    "orpo": PreferenceConfig(loss="orpo", beta=0.3, nll_coef=2.0),
    "bco": PreferenceConfig(loss="bco", beta=0.2),
}
# one case per distinct path in the default suite (tests/extended.py): the length-desensitised
# token weights (which plain DPO's pass shares), the odds ratio with its NLL term (RPO's NLL),
# the reference-free length-normalised margin (CPO's), BCO's reward shift
CORE_CASES = ("dpo_ld", "orpo", "simpo", "bco")


@functools.cache
def setup_pairs(num_pairs: int = 6):
    """A tiny policy and `num_pairs` arithmetic pairs (prompts and completions of several
    lengths, one long rejected response, one pair without a rejected token), with reference
    log-probs and BCO's shift filled in."""
    graphs, params, frozen = split_models(tiny_policy(7, vocab=VOCAB, layers=2))
    records = arithmetic_preference_records(
        ArithmeticConfig(max_digits=3, train_size=num_pairs), seed=5
    )
    records[2] = {**records[2], "rejected": records[2]["rejected"] * 4}  # a long rejected one
    batch = jax.tree.map(jnp.asarray, _records_batch(records))
    batch = batch._replace(  # a padding pair: it leaves the loss and the counts
        rejected=batch.rejected._replace(
            completion_mask=batch.rejected.completion_mask.at[4].set(0.0)
        )
    )
    rng = np.random.default_rng(5)
    batch = batch._replace(
        ref_chosen_logp=jnp.asarray(-rng.uniform(5, 15, num_pairs), jnp.float32),
        ref_rejected_logp=jnp.asarray(-rng.uniform(5, 15, num_pairs), jnp.float32),
        reward_shift=jnp.full((num_pairs,), 0.3, jnp.float32),
    )
    return graphs, params, frozen, batch


def _setup():
    return setup_pairs(6)


def objective_value_and_grad(objective, params, frozen, batch):
    """`((loss, metrics), grads)` of an objective's loss on one whole batch, jitted."""
    norms = preference_normalizers(batch)

    def loss(p):
        return objective.loss(p, frozen, batch, norms, 0.0)

    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)


def assert_same_loss_metrics_and_grads(ours, theirs):
    """Two `objective_value_and_grad` results agree to float32 rounding (and the gradient is
    not trivially zero)."""
    (value_o, metrics_o), grads_o = ours
    (value, metrics), grads = theirs
    np.testing.assert_allclose(value_o, value, rtol=1e-5, atol=1e-6)
    assert metrics_o.keys() == metrics.keys()
    for key in metrics:
        np.testing.assert_allclose(metrics_o[key], metrics[key], rtol=1e-5, atol=1e-5, err_msg=key)
    assert tree_max_abs_diff(grads_o, grads) < 2e-5
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads)) > 1e-3


@pytest.mark.parametrize("name", split_cases(sorted(CASES), CORE_CASES))
def test_loss_metrics_and_gradients_equal_the_concatenated_forward(name):
    config = CASES[name]
    graphs, params, frozen, batch = _setup()
    results = [
        objective_value_and_grad(preference_objective(c, graphs), params, frozen, batch)
        for c in (dataclasses.replace(config, shared_prompt=True), config)
    ]
    assert_same_loss_metrics_and_grads(*results)


def test_the_shared_forward_runs_each_prompt_once(monkeypatch):
    """The policy's forward goes through `Decoder.shared_prompt_hidden_states` with `G = 2`, on
    rows interleaved pair by pair (chosen `2n`, rejected `2n + 1`)."""
    graphs, params, frozen, batch = _setup()
    calls = []
    original = Decoder.shared_prompt_hidden_states

    def spy(self, tokens, positions, **kw):
        calls.append((np.asarray(tokens), kw["group_size"]))
        return original(self, tokens, positions, **kw)

    monkeypatch.setattr(Decoder, "shared_prompt_hidden_states", spy)
    objective = preference_objective(PreferenceConfig(loss="dpo", shared_prompt=True), graphs)
    objective.loss(params, frozen, batch, preference_normalizers(batch), 0.0)  # eager
    (tokens, group_size), *_ = calls
    assert group_size == 2
    joint = interleave_pairs(batch.chosen, batch.rejected)
    np.testing.assert_array_equal(tokens, np.asarray(joint.tokens))
    P = tokens.shape[1] - joint.completion_mask.shape[1]
    np.testing.assert_array_equal(tokens[0::2, :P], tokens[1::2, :P])  # one prompt per pair
    T_c = batch.chosen.completion_mask.shape[1]
    np.testing.assert_array_equal(tokens[0::2, P : P + T_c], np.asarray(batch.chosen.tokens)[:, P:])


def test_interleave_pairs_pads_to_a_common_length_and_alternates_rows():
    c = SequenceBatch(jnp.array([[1, 2, 3], [4, 5, 6]]), jnp.ones((2, 3)), jnp.ones((2, 1)))
    r = SequenceBatch(jnp.array([[1, 2, 7, 8], [4, 5, 9, 9]]), jnp.ones((2, 4)), jnp.ones((2, 2)))
    joint = interleave_pairs(c, r)
    assert joint.tokens.tolist() == [[1, 2, 3, 0], [1, 2, 7, 8], [4, 5, 6, 0], [4, 5, 9, 9]]
    assert joint.completion_mask.tolist() == [[1, 0], [1, 1], [1, 0], [1, 1]]


@pytest.mark.parametrize("loss", ["dpo", "bco"])
def test_prepared_reference_logprobs_and_bco_shift_equal_the_concatenated_forward(loss):
    graphs, params, frozen, batch = _setup()
    batch = batch._replace(ref_chosen_logp=None, ref_rejected_logp=None, reward_shift=None)
    ref = jax.tree.map(lambda x: x * 1.01, params["policy"])
    out = {}
    for shared in (False, True):
        config = PreferenceConfig(loss=loss, shared_prompt=shared)
        fn = make_logprob_fn(graphs.policy, group_size=config.prompt_group_size)
        moments = losses.init_running_moments() if loss == "bco" else None
        out[shared], _ = prepare_preference_batch(
            config,
            batch,
            logprob_fn=fn,
            policy_params=params["policy"],
            ref_params=ref,
            frozen=frozen["policy"],
            reward_moments=moments,
        )
    for field in ("ref_chosen_logp", "ref_rejected_logp", "reward_shift"):
        plain, shared = getattr(out[False], field), getattr(out[True], field)
        assert (plain is None) == (loss == "dpo" and field == "reward_shift")
        if plain is not None:
            np.testing.assert_allclose(shared, plain, rtol=1e-5, atol=1e-5, err_msg=field)
    assert float(jnp.min(out[True].ref_chosen_logp)) < -1.0


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
def test_update_on_a_one_device_mesh_equals_the_concatenated_forward(axis_types):
    """Two accumulated micro-batches of RPO under `jax.set_mesh` (the runner's setting), with
    the pairs interleaved inside the program: the same parameters as the concatenated form."""
    graphs, params, frozen, batch = _setup()
    mesh = make_mesh(MeshConfig(axis_types=axis_types), devices=jax.devices()[:1])
    tx = make_optimizer(OptimConfig(name="sgd", learning_rate=0.5, accumulation_steps=2))
    results = {}
    for shared in (False, True):
        config = PreferenceConfig(loss="rpo", beta=0.3, shared_prompt=shared)
        step = jax.jit(
            functools.partial(
                update_step,
                objective=preference_objective(config, graphs),
                optimizer=tx,
                accumulation_steps=2,
            )
        )
        with jax.set_mesh(mesh):
            state = init_train_state(params, frozen, tx, key=jax.random.key(0))
            results[shared] = step(state, batch)
    (plain, m_plain), (ours, m_ours) = results[False], results[True]
    np.testing.assert_allclose(m_ours["loss/total"], m_plain["loss/total"], rtol=1e-5)
    assert tree_max_abs_diff(ours.params, plain.params) < 1e-5
    assert tree_max_abs_diff(ours.params, params) > 1e-4


def test_joint_logprobs_keep_the_concatenated_layout_without_shared_prompt():
    c = SequenceBatch(jnp.array([[1, 2, 3]]), jnp.ones((1, 3)), jnp.ones((1, 2)))
    r = SequenceBatch(jnp.array([[1, 5, 6]]), jnp.ones((1, 3)), jnp.ones((1, 2)))
    seen = []

    def fn(p, f, s):
        seen.append(s.tokens.tolist())
        return s.tokens[:, -2:].astype(jnp.float32)

    lp_c, lp_r = joint_token_logprobs(fn, None, None, PreferenceBatch(c, r))
    assert seen == [[[1, 2, 3], [1, 5, 6]]]
    assert lp_c.tolist() == [[2.0, 3.0]] and lp_r.tolist() == [[5.0, 6.0]]


def test_kto_has_no_pair_to_share_a_prompt_with():
    with pytest.raises(ValueError, match="`shared_prompt` needs pairs that share a prompt"):
        PreferenceConfig(loss="kto", shared_prompt=True)
    with pytest.raises(ValueError, match="`shared_prompt` must be a bool, got 1"):
        PreferenceConfig(shared_prompt=1)


def test_the_runner_turns_it_on_for_paired_losses_with_shared_prompt_forward():
    from jaxrl_llm.runner.config import ModelSection, RunConfig, TrainConfig

    def run_config(loss, **train):
        return RunConfig(
            model=ModelSection(checkpoint="/m"),
            preference=PreferenceConfig(loss=loss),
            train=TrainConfig(**train),
        )

    assert run_config("dpo").preference.shared_prompt
    assert run_config("simpo").objective.shared_prompt
    assert not run_config("kto").preference.shared_prompt
    assert not run_config("dpo", shared_prompt_forward=False).preference.shared_prompt


# ---------------------------------------------------------------- reward models


def test_reward_model_loss_and_gradients_equal_the_concatenated_forward():
    """Bradley-Terry with the centring term; the padding pair's empty rejected completion is
    scored at its prompt's last token in both forms."""
    from jaxrl_llm.models import ValueModel
    from jaxrl_llm.train import RewardModelConfig, reward_model_objective, sequence_scores
    from tests.rewards.test_reward_model import CFG

    *_, batch = _setup()
    graphs, params, frozen = split_models(ValueModel(CFG, rngs=nnx.Rngs(3)))
    out = {}
    for shared in (False, True):
        config = RewardModelConfig(center_coef=0.1, shared_prompt=shared)
        objective = reward_model_objective(config, graphs)
        norms = preference_normalizers(batch)

        def loss(p, objective=objective, norms=norms):
            return objective.loss(p, frozen, batch, norms, 0.0)

        out[shared] = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    ((value, metrics), grads), ((value_s, metrics_s), grads_s) = out[False], out[True]
    np.testing.assert_allclose(value_s, value, rtol=1e-5, atol=1e-6)
    for key in metrics:
        np.testing.assert_allclose(metrics_s[key], metrics[key], rtol=1e-5, atol=1e-5, err_msg=key)
    assert tree_max_abs_diff(grads_s, grads) < 2e-5
    assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads)) > 1e-3
    model = nnx.merge(graphs.policy, params["policy"], frozen["policy"])
    joint = interleave_pairs(
        batch.chosen,
        batch.rejected._replace(
            attention_mask=batch.rejected.attention_mask.at[
                4, -batch.rejected.completion_mask.shape[1] :
            ].set(0)
        ),
    )
    np.testing.assert_allclose(
        sequence_scores(model, joint, group_size=2), sequence_scores(model, joint), atol=1e-5
    )


def test_the_runner_shares_reward_model_prompts_with_shared_prompt_forward():
    from jaxrl_llm.runner.config import ModelSection, RunConfig, TrainConfig
    from jaxrl_llm.train import RewardModelConfig

    def run_config(**train):
        return RunConfig(
            model=ModelSection(checkpoint="/m"),
            reward_model=RewardModelConfig(),
            train=TrainConfig(**train),
        )

    assert run_config().reward_model.shared_prompt
    assert not run_config(shared_prompt_forward=False).reward_model.shared_prompt


def test_an_eager_prepare_refuses_pairs_whose_prompts_differ():
    graphs, params, frozen, batch = _setup()
    batch = batch._replace(ref_chosen_logp=None, ref_rejected_logp=None, reward_shift=None)
    P = batch.rejected.tokens.shape[1] - batch.rejected.completion_mask.shape[1]
    tokens = batch.rejected.tokens.at[3, P - 1].add(1)  # the last prompt token (never padding)
    bad = batch._replace(rejected=batch.rejected._replace(tokens=tokens))
    config = PreferenceConfig(shared_prompt=True)
    kw = dict(
        logprob_fn=make_logprob_fn(graphs.policy, group_size=2),
        policy_params=params["policy"],
        ref_params=params["policy"],
        frozen=frozen["policy"],
    )
    with pytest.raises(
        ValueError, match="pair 3's chosen and rejected rows have different prompts"
    ):
        prepare_preference_batch(config, bad, **kw)
    prepare_preference_batch(config, batch, **kw)  # the same pairs with their own prompts pass
    prepare_preference_batch(PreferenceConfig(), bad, **kw)  # without sharing nothing is assumed
