"""The in-graph parts of the compiled RL iteration (`runner.compiled`): the train split as device
arrays, the reward signal, and the reward / response metrics, in `jnp`.

Each mirrors a host-side piece of the step-by-step loop and gives the same values:

    TaskArrays / task_arrays   the rows `runner.task.prompt_batch` makes, for the whole split
    in_graph_scores            `runner.scoring.combine_rewards` for the exact-answer reward
                               (w·r, DAPO's overlong punishment, GDPO's decoupled signal)
    rollout_metrics            `runner.scoring.reward_metrics` when every row is valid
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

import losses
from jaxrl_llm.rewards import combined_advantages
from jaxrl_llm.runner.context import RunContext
from jaxrl_llm.runner.task import prompt_batch


class TaskArrays(NamedTuple):
    """The whole train split at the run's fixed lengths, as device arrays (gathered per step).

    Attributes:
      prompt_tokens: `[M, P]` int32, left-padded.
      prompt_mask: `[M, P]` bool.
      answer_tokens: `[M, A]` int32.
      answer_lengths: `[M]` int32.

    Examples:
      >>> TaskArrays(*([None] * 4))._fields
      ('prompt_tokens', 'prompt_mask', 'answer_tokens', 'answer_lengths')
    """

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    answer_tokens: jax.Array
    answer_lengths: jax.Array


def task_arrays(ctx: RunContext) -> TaskArrays:
    """Tokenize every train example once (`prompt_batch` at the run's `P` and `A`).

    A row of the result equals the row `prompt_batch` makes for that example in any batch, so
    gathering rows on the device gives the step-by-step loop's prompt batch.

    Examples:
      `tests/runner/test_compiled.py` checks its rows against `prompt_batch` on a prepared run;
      for a split of 5 examples at `P = 16` the prompt tokens are `[5, 16]`:

      >>> TaskArrays(prompt_tokens=jnp.zeros((5, 16), jnp.int32), prompt_mask=None,
      ...            answer_tokens=None, answer_lengths=None).prompt_tokens.shape
      (5, 16)
    """
    batch = prompt_batch(ctx.task, ctx.task.train, ctx.config, ctx.tokenizer)
    arrays = TaskArrays(
        prompt_tokens=np.asarray(batch.prompt_tokens, np.int32),
        prompt_mask=np.asarray(batch.prompt_mask, bool),
        answer_tokens=np.asarray(batch.answer_tokens, np.int32),
        answer_lengths=np.asarray(batch.answer_lengths, np.int32),
    )
    return jax.device_put(arrays, NamedSharding(ctx.mesh, PartitionSpec()))


def in_graph_scores(
    correct: jax.Array,
    lengths: jax.Array,
    *,
    weight: float,
    group_size: int,
    combine: str = "sum",
    overlong: Any = None,
    overlong_max_length: int | None = None,
    truncated: jax.Array | None = None,
    truncation_penalty: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """`(total[N], signal[N])` of the in-graph reward: `runner.scoring.combine_rewards` in `jnp`.

        total  = w·r + p(len)                         p: DAPO's overlong punishment (or 0)
        signal = total                                combine: sum
                 Σ_k w_k·groupnorm(r_k)               combine: decoupled (GDPO), p weight 1

    Args:
      correct: `[N]` float32 0/1 from `exact_answer_reward`.
      lengths: `[N]` int completion lengths.
      weight: the reward function's weight `w`.
      group_size: `G`.
      combine: `rewards.combine`.
      overlong: the `OverlongConfig` (None: off).
      overlong_max_length: its resolved `max_length`.
      truncated: `[N]` bool, the rows that hit the budget (with `truncation_penalty`).
      truncation_penalty: `train.truncation_penalty` (None: off; `losses.truncation_penalty`
        on the total, as `runner.scoring.combine_rewards` does).

    Examples:
      >>> total, signal = in_graph_scores(jnp.array([1.0, 0.0]), jnp.array([2, 6]), weight=1.0,
      ...                                 group_size=2)
      >>> total.tolist(), signal.tolist()
      ([1.0, 0.0], [1.0, 0.0])
    """
    components = correct.astype(jnp.float32)[:, None]
    weights = jnp.asarray([weight], jnp.float32)
    if overlong is not None:
        penalty = losses.overlong_penalty(
            lengths.astype(jnp.float32),
            max_length=overlong_max_length,
            buffer_length=overlong.buffer_length,
            factor=overlong.factor,
        ).astype(jnp.float32)
        components = jnp.concatenate([components, penalty[:, None]], axis=1)
        weights = jnp.concatenate([weights, jnp.ones(1, jnp.float32)])
    total = jnp.sum(components * weights, axis=1).astype(jnp.float32)
    if truncation_penalty is not None:
        total = losses.truncation_penalty(total, truncated, coef=truncation_penalty)
    if combine != "decoupled":
        return total, total
    signal = combined_advantages(
        components,
        weights,
        group_size=group_size,
        mode="decoupled",
        valid=jnp.ones(components.shape[0], bool),
    )
    return total, signal.astype(jnp.float32)


def rollout_metrics(
    total: jax.Array,
    correct: jax.Array,
    lengths: jax.Array,
    truncated: jax.Array,
) -> dict[str, jax.Array]:
    """The reward and response metrics of `runner.scoring.reward_metrics`, in `jnp` (every row
    is valid: the in-graph reward never fails).

    Examples:
      >>> m = rollout_metrics(jnp.array([1.0, 0.0]), jnp.array([1.0, 0.0]), jnp.array([2, 1]),
      ...                     jnp.array([False, False]))
      >>> float(m["reward/mean"]), float(m["reward/accuracy"]), float(m["response/empty_frac"])
      (0.5, 0.5, 0.5)
    """
    f32 = jnp.float32
    content = lengths - (~truncated).astype(lengths.dtype)
    return {
        "reward/mean": jnp.mean(total),
        "reward/std": jnp.std(total),
        "reward/accuracy": jnp.mean((correct >= 1.0).astype(f32)),
        "reward/nonfinite": jnp.sum((~jnp.isfinite(total)).astype(f32)),
        "reward/valid_frac": jnp.ones((), f32),
        "response/length_mean": jnp.mean(lengths.astype(f32)),
        "response/length_max": jnp.max(lengths).astype(f32),
        "response/truncated_frac": jnp.mean(truncated.astype(f32)),
        "response/empty_frac": jnp.mean((content <= 0).astype(f32)),
        "rollout/completion_tokens": jnp.sum(lengths).astype(f32),
    }
