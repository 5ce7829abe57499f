"""`Rollout`: what the sampler returns, a pytree of static-shape arrays.

Rows are prompt-major (`n = b·G + g` for prompt `b`, sample `g`). Prompts are left-padded to
the bucketed length `P`, completions have the static budget `T`, and `S = P + T`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_llm.models.cache import positions_from_mask

Array = jax.Array


class Rollout(NamedTuple):
    """Sampled sequences with their masks and float32 behaviour log-probs.

    Completion token `t` of row `n` is `completion_tokens[n, t] = tokens[n, P + t]`; it counts
    (`completion_mask = 1`) for `t < lengths[n]`, which includes the stop token. After a stop
    the tokens are the config's `pad_id` and the log-probs are 0.

    - `logprobs[n, t] = log softmax(z/τ)[y]`: the policy at the sampling temperature τ, no
      filters. This equals `losses.token_logprobs(logits, tokens, temperature=τ)` of a fresh
      forward pass, so a PPO ratio against it starts at exactly 1. Greedy rollouts (τ = 0)
      report τ = 1.
    - `sampling_logprobs[n, t]`: the log-prob under the distribution actually sampled from
      (after top-k / top-p / min-p): the behaviour policy for off-policy corrections when
      filters are on. Equal to `logprobs` without filters; 0 for greedy rollouts.
    - `truncated[n]`: the row reached its token budget without emitting a stop token.

    Examples:
      >>> r = Rollout(
      ...     tokens=jnp.array([[0, 5, 6, 7]]), prompt_mask=jnp.array([[False, True]]),
      ...     completion_tokens=jnp.array([[6, 7]]), completion_mask=jnp.array([[True, False]]),
      ...     logprobs=jnp.array([[-0.5, 0.0]]), sampling_logprobs=jnp.array([[-0.5, 0.0]]),
      ...     lengths=jnp.array([1]), truncated=jnp.array([False]))
      >>> r.attention_mask.astype(int).tolist(), r.positions.tolist()
      ([[0, 1, 1, 0]], [[0, 0, 1, 1]])
    """

    tokens: Array  # [N, S] int32, left-padded prompt then completion
    prompt_mask: Array  # [N, P] bool, True on real prompt tokens
    completion_tokens: Array  # [N, T] int32
    completion_mask: Array  # [N, T] bool, True up to and including the stop token
    logprobs: Array  # [N, T] float32, log π(y)/τ-policy, unfiltered
    sampling_logprobs: Array  # [N, T] float32, under the filtered sampling distribution
    lengths: Array  # [N] int32, completion tokens that count
    truncated: Array  # [N] bool, budget reached without a stop token or stop string

    @property
    def attention_mask(self) -> Array:
        """`[N, S]` bool: real prompt tokens and counted completion tokens."""
        return jnp.concatenate([self.prompt_mask, self.completion_mask], axis=1)

    @property
    def positions(self) -> Array:
        """`[N, S]` int32 rotary positions for a fresh forward pass over `tokens`."""
        return positions_from_mask(self.attention_mask)
