"""Learning tests: GRPO, PPO with a critic, and online DPO on a toy task with a known optimum.

Task: after a random 4-token prompt, write 4 tokens; the reward is the fraction of them in the
target set {1, …, 8} of a 53-token vocabulary (optimum 1.0, a uniform policy scores 8/53 ≈ 0.15).
Completions come from the compiled sampler (`jaxrl_llm.sampler.sample_tokens`, G samples per
prompt); the loop is the one the training stack runs: sample → old / reference / critic
forwards → rewards → `build_rl_batch` → compiled update step. Online DPO pairs each prompt's
best and worst of its 8 samples (`online_dpo_select`): 4 pairs per step here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.sampler import SamplingConfig, sample_tokens
from jaxrl_llm.train import SequenceBatch, build_rl_batch, preset, reference_params
from tests.train.helpers import V
from tests.train.test_update import fresh_state

B, G, P, T = 4, 8, 4, 4


@functools.cache
def _sampler(graphdef):
    config = SamplingConfig(max_new_tokens=T, num_samples=G, min_bucket=P)
    sample = jax.jit(functools.partial(sample_tokens, graphdef, config=config))

    def run(params, frozen, prompts, key):
        return sample(nnx.merge_state(params, frozen), prompts, jnp.ones_like(prompts), key)

    return run


@jax.jit
def _reward(tokens: jax.Array) -> jax.Array:
    completion = tokens[:, P:]
    return jnp.mean(((completion >= 1) & (completion <= 8)).astype(jnp.float32), axis=1)


@pytest.mark.parametrize(("name", "steps"), [("grpo", 30), ("ppo", 24), ("online_dpo", 30)])
def test_reward_improves_on_the_toy_task(compiled, name, steps):
    alg = preset(name)
    step = compiled.step(name)
    graphs, state = fresh_state(alg, compiled.optimizer)
    ref = reference_params(state.params)
    logprob_fn = compiled.logprob_fn()
    value_fn = compiled.value_fn(alg.critic.kind) if alg.critic else None
    sample = _sampler(graphs.policy)
    key = jax.random.key(42)
    rewards = []
    for i in range(steps):
        key, k_prompt, k_sample = jax.random.split(key, 3)
        prompts = jax.random.randint(k_prompt, (B, P), 1, V)
        rollout = sample(state.params["policy"], state.frozen["policy"], prompts, k_sample)
        tokens, attention = rollout.tokens, rollout.attention_mask.astype(jnp.int32)
        seqs = SequenceBatch(tokens, attention, rollout.completion_mask.astype(jnp.float32))
        old = logprob_fn(state.params["policy"], state.frozen["policy"], seqs)
        if i == 0:  # the trainer's forward scores exactly what the sampler drew
            np.testing.assert_allclose(old, rollout.logprobs, atol=1e-5)
        r = _reward(tokens)
        batch, _ = build_rl_batch(
            alg,
            tokens=tokens,
            attention_mask=attention,
            completion_mask=seqs.completion_mask,
            rewards=r,
            group_size=G,
            old_logp=old,
            ref_logp=logprob_fn(ref, state.frozen["policy"], seqs),
            old_values=value_fn(state.params, state.frozen, seqs) if value_fn else None,
            kl_coef=state.kl.beta,
        )
        state, metrics = step(state, batch)
        rewards.append(float(r.mean()))
    first, last = np.mean(rewards[:5]), np.mean(rewards[-5:])
    assert last > first + 0.25 and last > 0.45, rewards
    assert np.isfinite(float(metrics["loss/total"]))
