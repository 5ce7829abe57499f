"""Rewards of one rollout: in-graph or on the host, shaping, combination, and the signal that
goes to the advantage estimator.

Per prompt batch of `B` prompts × `G` samples:

    components r[N, K]   in-graph exact_answer_reward (rewards.jax_native) or the host reward
                         functions (`score_completions`, with the config's failure policy;
                         in a multi-process job each process scores its block of groups,
                         `process_groups`, and the blocks are gathered)
    valid[N]             False on rows of groups dropped by `on_failure: drop_group`
    overlong p[N]        −factor·ramp(length)  (train.overlong; DAPO's soft punishment)
    total[N]             Σ_k w_k r_k + p                                  (reward/mean)
                         then, for truncated rows, c·total (0 <= c <= 1) or c (c < 0)
                         (train.truncation_penalty c: ProRL's stop-properly penalty)
    signal[N]            total                  with rewards.combine: sum
                         Σ_k w_k·groupnorm(r_k) with rewards.combine: decoupled (GDPO, the
                         punishment as one more component of weight 1)
    correct[N]           first component >= 1 (the accuracy: the verifiers give 1 for a
                         correct answer)

The signal is what `build_rl_batch` turns into advantages; with `decoupled` it is already
group-normalised, so the group estimator only centres it (its `scale` is set to "none").
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import losses
from jaxrl_llm.data import PromptBatch
from jaxrl_llm.rewards import (
    RewardFunctionError,
    combined_advantages,
    merge_reward_metrics,
    reward_metric_names,
    score_completions,
)
from jaxrl_llm.runner.config import RunConfig
from sharding import gather_from_processes


class Scores(NamedTuple):
    """Host-side rewards of `N` rows (see the module docstring).

    Examples:
      >>> s = Scores(np.ones(2), np.ones(2), np.ones(2, bool), np.ones(2, bool), {})
      >>> s.total.tolist()
      [1.0, 1.0]
    """

    total: np.ndarray  # [N] float32
    signal: np.ndarray  # [N] float32
    valid: np.ndarray  # [N] bool
    correct: np.ndarray  # [N] bool
    metrics: dict[str, float]


def run_stop_ids(config: RunConfig, tokenizer: Any) -> tuple[int, ...]:
    """The token ids that end a completion in a run: `sampling.stop_tokens` and the tokenizer's
    EOS. The sampler stops on them; the rewards, in-graph or on the host, read the completion
    up to (not including) the first of them.

    Examples:
      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.sampler import SamplingConfig
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> from jaxrl_llm.train import SFTConfig
      >>> cfg = RunConfig(model=ModelSection(checkpoint="/m"), sft=SFTConfig(),
      ...                 sampling=SamplingConfig(stop_tokens=(10,)))
      >>> run_stop_ids(cfg, ByteTokenizer())
      (10, 258)
    """
    return tuple(sorted({*config.sampling.stop_tokens, tokenizer.eos_id}))


def component_rewards(
    config: RunConfig,
    functions: list[Any],
    batch: PromptBatch,
    completion_tokens: np.ndarray,
    completion_mask: np.ndarray,
    in_graph: np.ndarray | None,
    tokenizer: Any,
    group_size: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, float]]:
    """`(rewards[N, K], valid[N], failed[N, K], metrics)` from the in-graph scores or the host
    functions; `failed` marks the rows where a function failed (their reward is the failure
    score).

    Examples:
      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.train import SFTConfig
      >>> from jaxrl_llm.rewards import RewardConfig
      >>> cfg = RunConfig(model=ModelSection(checkpoint="/m"), sft=SFTConfig(),
      ...                 rewards=RewardConfig(jax_native=True))
      >>> r, valid, failed, _ = component_rewards(
      ...     cfg, [], None, None, None, np.array([1.0, 0.0]), None, 2)
      >>> r.tolist(), valid.tolist(), failed.tolist()
      ([[1.0], [0.0]], [True, True], [[False], [False]])
    """
    if in_graph is not None:
        rewards = np.asarray(in_graph, np.float32)[:, None]
        return rewards, np.ones(rewards.shape[0], bool), np.zeros(rewards.shape, bool), {}
    if jax.process_count() > 1:
        return _score_on_processes(
            config, functions, batch, completion_tokens, completion_mask, tokenizer, group_size
        )
    scores = score_completions(
        functions,
        config.rewards,
        examples=batch.examples,
        prompts=batch.prompts,
        completion_tokens=completion_tokens,
        completion_mask=completion_mask,
        tokenizer=tokenizer,
        group_size=group_size,
        stop_ids=run_stop_ids(config, tokenizer),
    )
    return scores.rewards, scores.valid, scores.failed, scores.metrics


def process_groups(num_groups: int, num_processes: int, process: int) -> range:
    """The groups of a batch that `process` scores in a multi-process job: consecutive blocks
    of ⌈B / P⌉ groups, the last ones shorter or empty. A group stays on one process, so the
    `drop_group` policy sees whole groups.

    Examples:
      >>> [list(process_groups(5, 2, p)) for p in range(2)]
      [[0, 1, 2], [3, 4]]
      >>> [len(process_groups(1, 2, p)) for p in range(2)]
      [1, 0]
    """
    per = -(-num_groups // num_processes)
    return range(min(num_groups, process * per), min(num_groups, (process + 1) * per))


def _score_on_processes(
    config: RunConfig,
    functions: list[Any],
    batch: PromptBatch,
    completion_tokens: np.ndarray,
    completion_mask: np.ndarray,
    tokenizer: Any,
    group_size: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, float]]:
    """`component_rewards` in a multi-process job: this process scores its `process_groups`,
    then every process gathers all the blocks (`gather_from_processes`, padded to ⌈B / P⌉
    groups). A reward function is called once per completion in the whole job, and every
    process ends with the same rewards. A failure on one process (`on_failure: fail`) stops
    every process after the gather, instead of leaving the others waiting in it."""
    B, P, G = len(batch.examples), jax.process_count(), group_size
    names = reward_metric_names([f.name for f in functions])
    width = -(-B // P) * G
    local = {
        "failed": np.asarray(False),
        "rewards": np.zeros((width, len(functions)), np.float32),
        "valid": np.zeros(width, bool),
        "row_failed": np.zeros((width, len(functions)), bool),
        "metrics": np.zeros(len(names), np.float64),
    }
    mine, error = process_groups(B, P, jax.process_index()), None
    if len(mine):
        rows = slice(mine.start * G, mine.stop * G)
        try:
            scores = score_completions(
                functions,
                config.rewards,
                examples=batch.examples[mine.start : mine.stop],
                prompts=batch.prompts[mine.start : mine.stop],
                completion_tokens=np.asarray(completion_tokens)[rows],
                completion_mask=np.asarray(completion_mask)[rows],
                tokenizer=tokenizer,
                group_size=G,
                stop_ids=run_stop_ids(config, tokenizer),
            )
        except Exception as err:  # every process must reach the gather
            error, local["failed"] = err, np.asarray(True)
        else:
            local["rewards"][: rows.stop - rows.start] = scores.rewards
            local["valid"][: rows.stop - rows.start] = scores.valid
            local["row_failed"][: rows.stop - rows.start] = scores.failed
            local["metrics"][:] = [scores.metrics[name] for name in names]
    gathered = gather_from_processes(local)
    if error is not None:
        raise error
    return _join_process_scores(gathered, names, B, G)


def _join_process_scores(
    gathered: dict[str, np.ndarray], names: list[str], num_groups: int, group_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, float]]:
    """`(rewards[N, K], valid[N], failed[N, K], metrics)` of the whole batch from every
    process's block of groups (`_score_on_processes`): `gathered` holds, per process `p`
    (leading axis), `failed` (scoring raised there), `rewards`, `valid` and `row_failed` padded
    to ⌈B / P⌉ groups, and the metric values in `names` order.

    Raises:
      RewardFunctionError: scoring failed on a process; that process's log has the example.

    Examples:
      >>> names = reward_metric_names(["acc"])
      >>> metrics = np.zeros((2, len(names)))
      >>> metrics[:, 0] = [1.0, 0.0]  # reward/acc/mean of each process's rows
      >>> gathered = {"failed": np.array([False, False]), "metrics": metrics,
      ...             "rewards": np.array([[[1.0], [1.0]], [[0.0], [0.0]]], np.float32),
      ...             "valid": np.ones((2, 2), bool), "row_failed": np.zeros((2, 2, 1), bool)}
      >>> rewards, valid, _, m = _join_process_scores(gathered, names, num_groups=3, group_size=1)
      >>> rewards[:, 0].tolist(), m["reward/acc/mean"]  # the padding row is left out
      ([1.0, 1.0, 0.0], 0.6666666666666666)
    """
    failed = np.flatnonzero(gathered["failed"])
    if failed.size:
        raise RewardFunctionError(
            f"scoring the rewards failed on process {int(failed[0])} of the job (its log shows "
            "the failing example); every process stops."
        )
    P = len(gathered["failed"])
    rows = [len(process_groups(num_groups, P, p)) * group_size for p in range(P)]
    rewards = np.concatenate([gathered["rewards"][p, :n] for p, n in enumerate(rows)])
    valid = np.concatenate([gathered["valid"][p, :n] for p, n in enumerate(rows)])
    row_failed = np.concatenate([gathered["row_failed"][p, :n] for p, n in enumerate(rows)])
    parts = [dict(zip(names, map(float, values), strict=True)) for values in gathered["metrics"]]
    return rewards, valid, row_failed, merge_reward_metrics(parts, rows)


def combine_rewards(
    config: RunConfig,
    rewards: np.ndarray,
    valid: np.ndarray,
    lengths: np.ndarray,
    group_size: int,
    truncated: np.ndarray | None = None,
    failed: np.ndarray | None = None,
) -> Scores:
    """Shaping and combination of `rewards[N, K]` (module docstring); metrics are filled by
    `reward_metrics`. `correct` (the accuracy metrics) is the first function's reward >= 1 on
    rows where it did not fail (`failed[N, K]`; a failure score of 1 is no right answer).

    Examples:
      >>> from jaxrl_llm.runner.config import ModelSection, TrainConfig, OverlongConfig
      >>> from jaxrl_llm.train import AlgorithmConfig
      >>> from jaxrl_llm.sampler import SamplingConfig
      >>> cfg = RunConfig(model=ModelSection(checkpoint="/m"), algorithm=AlgorithmConfig(),
      ...     sampling=SamplingConfig(num_samples=2, max_new_tokens=8),
      ...     train=TrainConfig(overlong=OverlongConfig(buffer_length=4)))
      >>> s = combine_rewards(cfg, np.array([[1.0], [0.0]]), np.ones(2, bool), np.array([2, 6]), 2)
      >>> s.total.tolist(), s.correct.tolist()
      ([1.0, -0.5], [True, False])
    """
    rewards = np.asarray(rewards, np.float32)
    weights = np.asarray([f.weight for f in config.rewards.functions], np.float32)
    components, comp_weights = rewards, weights
    if config.train.overlong is not None:
        penalty = np.asarray(
            losses.overlong_penalty(
                jnp.asarray(lengths, jnp.float32),
                max_length=config.overlong_max_length,
                buffer_length=config.train.overlong.buffer_length,
                factor=config.train.overlong.factor,
            ),
            np.float32,
        )
        components = np.concatenate([rewards, penalty[:, None]], axis=1)
        comp_weights = np.concatenate([weights, np.ones(1, np.float32)])
    total = (components * comp_weights).sum(axis=1).astype(np.float32)
    coef = config.train.truncation_penalty
    if coef is not None:
        if truncated is None:
            raise ValueError("combine_rewards: train.truncation_penalty needs `truncated`.")
        total = np.asarray(losses.truncation_penalty(total, truncated, coef=coef), np.float32)
    signal = total
    if config.rewards.combine == "decoupled":
        signal = np.asarray(
            combined_advantages(
                jnp.asarray(components),
                jnp.asarray(comp_weights),
                group_size=group_size,
                mode="decoupled",
                valid=jnp.asarray(valid),
            ),
            np.float32,
        )
    correct = rewards[:, 0] >= 1.0
    if failed is not None:
        correct &= ~np.asarray(failed, bool)[:, 0]
    return Scores(total=total, signal=signal, valid=valid, correct=correct, metrics={})


def group_has_spread(signal: np.ndarray, valid: np.ndarray, group_size: int) -> np.ndarray:
    """`keep[B]`: a valid group whose signal is not constant (DAPO's dynamic-sampling filter).

    Examples:
      >>> group_has_spread(np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0]), np.ones(6, bool), 2).tolist()
      [True, False, True]
    """
    s = signal.reshape(-1, group_size)
    v = valid.reshape(-1, group_size).all(axis=1)
    return v & (s.max(axis=1) > s.min(axis=1))


def reward_metrics(scores: Scores, lengths: np.ndarray, truncated: np.ndarray) -> dict[str, float]:
    """Reward and response metrics over the rows of a step: the reward's mean and std (ddof 0)
    over the valid rows; the accuracy over all rows, a row whose reward failed counting as not
    correct (as in evaluation), also when `drop_group` left its group out of the update.

    Examples:
      >>> s = Scores(np.array([1.0, 0.0]), np.array([1.0, 0.0]), np.ones(2, bool),
      ...            np.array([True, False]), {})
      >>> m = reward_metrics(s, np.array([2, 1]), np.array([False, False]))
      >>> m["reward/mean"], m["reward/accuracy"], m["response/empty_frac"]
      (0.5, 0.5, 0.5)
    """
    valid = scores.valid
    total = scores.total[valid]
    content = lengths - (~truncated).astype(lengths.dtype)  # tokens before the stop token
    return {
        "reward/mean": float(total.mean()) if total.size else 0.0,
        "reward/std": float(total.std()) if total.size else 0.0,
        "reward/accuracy": float(scores.correct.mean()),
        "reward/nonfinite": float((~np.isfinite(scores.total)).sum()),
        "reward/valid_frac": float(valid.mean()),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/truncated_frac": float(truncated.mean()),
        "response/empty_frac": float((content <= 0).mean()),
    }
