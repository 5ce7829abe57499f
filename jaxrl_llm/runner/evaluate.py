"""Held-out evaluation: greedy accuracy, accuracy at temperature 1, and pass@k.

On a fixed eval subset (the first `train.eval_prompts` examples of the eval split), in batches
of `train.prompts_per_step` prompts (the last one padded and masked), with the correctness of
the run's first reward function (a completion is correct when it scores >= 1, as the
verifiers do for a right answer):

    eval/accuracy_greedy   mean over prompts of correct(greedy completion)
    eval/accuracy          mean over prompts and n samples at temperature 1 (the policy's own
                           distribution: the run's top_k / top_p / min_p are not applied)
    eval/pass@k            mean over prompts of the unbiased estimator
                           pass@k = 1 − C(n − c, k) / C(n, k)     (c correct of n samples)

The estimator is from "Evaluating Large Language Models Trained on Code" (Chen et al., arXiv
2107.03374). `eval/accuracy` is pass@1 of the same samples. The sampling keys depend only on
the seed and the step, so an evaluation is reproducible and does not disturb training.

An SFT run also reports the held-out loss of its objective (TRL's `eval_loss`,
`evaluate_sft`): `eval/sft/nll`, the mean NLL per completion token of the eval subset's
(prompt, answer + EOS) pairs, over `eval/sft/tokens` tokens.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import numpy as np

from jaxrl_llm.data import eval_batches
from jaxrl_llm.runner.context import RunContext
from jaxrl_llm.runner.preference import evaluate_preference
from jaxrl_llm.runner.programs import nll_program, rollout_program
from jaxrl_llm.runner.rollout import in_graph_stop_ids, run_rollout
from jaxrl_llm.runner.scoring import component_rewards
from jaxrl_llm.runner.task import answer_fits, pad_rows, prompt_batch, sft_batch
from jaxrl_llm.train.shardings import place_batch
from sharding import fetch_global


def pass_at_k(num_samples: int, num_correct: np.ndarray, k: int) -> np.ndarray:
    """Unbiased pass@k per problem: `1 − C(n − c, k) / C(n, k)` (Chen et al., arXiv 2107.03374).

    Computed as `1 − Π_{i = n−c+1}^{n} (1 − k/i)` (no large binomials); 1 when `n − c < k`.

    Args:
      num_samples: `n`, samples per problem.
      num_correct: `[M]` int, `c` correct samples of each problem.
      k: `1 <= k <= n`.

    Returns:
      `[M]` float64.

    Examples:
      >>> pass_at_k(4, np.array([0, 1, 2, 4]), 2).round(4).tolist()
      [0.0, 0.5, 0.8333, 1.0]
    """
    if not 1 <= k <= num_samples:
        raise ValueError(f"pass_at_k: `k` must be in [1, n={num_samples}], got {k}.")
    c = np.asarray(num_correct, np.int64)
    if c.ndim != 1 or (c < 0).any() or (c > num_samples).any():
        raise ValueError(
            f"pass_at_k: `num_correct` must be [M] ints in [0, {num_samples}], got {c!r}."
        )
    out = np.ones(c.shape, np.float64)
    for m, correct in enumerate(c):
        if num_samples - correct >= k:
            terms = 1.0 - k / np.arange(num_samples - correct + 1, num_samples + 1)
            out[m] = 1.0 - float(np.prod(terms))
    return out


def _correct(
    ctx: RunContext, batch: Any, rollout: Any, in_graph: Any, group_size: int
) -> tuple[np.ndarray, int]:
    """`([B·G] bool, failures)`: the first reward function gives the completion >= 1, on rows
    where it did not fail (a failed row's failure score is no answer, right or wrong) and that
    no dropped group holds; `failures` counts the rows where it failed."""
    tokens, mask, in_graph = fetch_global(
        (rollout.completion_tokens, rollout.completion_mask, in_graph)
    )
    rewards, valid, failed, _ = component_rewards(
        ctx.config,
        ctx.reward_functions[:1],
        batch,
        tokens,
        mask,
        in_graph,
        ctx.tokenizer,
        group_size,
    )
    return (rewards[:, 0] >= 1.0) & valid & ~failed[:, 0], failed[:, 0]


def evaluate_policy(
    ctx: RunContext, params: Any, frozen: Any, key: jax.Array, *, num_prompts: int | None = None
) -> dict[str, float]:
    """Evaluate a policy on the eval subset (module docstring).

    Args:
      ctx: the run context.
      params: the policy's trainable parameters.
      frozen: its frozen parameters.
      key: the evaluation's sampling key.
      num_prompts: evaluate only the first this many eval examples (None: the whole subset).

    Returns:
      `{"eval/accuracy_greedy", "eval/accuracy", "eval/pass@k" for each k,
      "eval/num_prompts", "eval/samples", "time/eval_s"}`, and with host reward functions
      `"eval/reward_failures"` (the greedy and sampled rows where the first function failed:
      they count as not correct); `{}` when the data has no eval split.

    Examples:
      >>> from types import SimpleNamespace
      >>> no_eval_split = SimpleNamespace(task=SimpleNamespace(eval=[]))  # a RunContext's task
      >>> evaluate_policy(no_eval_split, params=None, frozen=None, key=None)
      {}
    """
    examples = ctx.task.eval[:num_prompts]
    if not examples:
        return {}
    started = time.perf_counter()
    config = ctx.config
    B, n = config.train.prompts_per_step, config.eval_samples
    greedy = rollout_program(
        ctx.graphs.policy,
        dataclasses.replace(
            ctx.sampling, temperature=0.0, num_samples=1, top_k=None, top_p=None, min_p=None
        ),
        in_graph_stop_ids(ctx.config, ctx.tokenizer),
    )
    sampled = rollout_program(
        ctx.graphs.policy,
        dataclasses.replace(
            ctx.sampling, temperature=1.0, num_samples=n, top_k=None, top_p=None, min_p=None
        ),
        in_graph_stop_ids(ctx.config, ctx.tokenizer),
    )
    greedy_hits, sampled_hits, failures = [], [], 0
    for i, (indices, valid) in enumerate(eval_batches(len(examples), B)):
        batch = prompt_batch(ctx.task, [examples[j] for j in indices], config, ctx.tokenizer)
        arrays = (batch.prompt_tokens, batch.prompt_mask, batch.answer_tokens, batch.answer_lengths)
        batch_key = jax.random.fold_in(key, i)
        g_rollout, g_reward = run_rollout(ctx, greedy, params, frozen, arrays, batch_key, 1)
        s_rollout, s_reward = run_rollout(ctx, sampled, params, frozen, arrays, batch_key, n)
        g_ok, g_failed = _correct(ctx, batch, g_rollout, g_reward, 1)
        s_ok, s_failed = _correct(ctx, batch, s_rollout, s_reward, n)
        greedy_hits.append(g_ok[valid])
        sampled_hits.append(s_ok.reshape(B, n)[valid])
        failures += int(g_failed[valid].sum() + s_failed.reshape(B, n)[valid].sum())
    greedy_ok = np.concatenate(greedy_hits)
    sampled_ok = np.concatenate(sampled_hits)
    correct = sampled_ok.sum(axis=1)
    metrics = {
        "eval/accuracy_greedy": float(greedy_ok.mean()),
        "eval/accuracy": float(sampled_ok.mean()),
        "eval/num_prompts": float(len(examples)),
        "eval/samples": float(n),
    }
    if not config.rewards.jax_native:  # host functions: a failed call counts as not correct
        metrics["eval/reward_failures"] = float(failures)
    for k in config.train.eval_pass_k:
        metrics[f"eval/pass@{k}"] = float(pass_at_k(n, correct, k).mean())
    metrics["time/eval_s"] = time.perf_counter() - started
    return metrics


def evaluate_state(ctx: RunContext, state: Any, key: jax.Array) -> dict[str, float]:
    """Everything a run evaluates for a train state: `evaluate_policy` with `key`, an SFT run's
    held-out NLL (`evaluate_sft`), a preference run's held-out examples
    (`runner.preference.evaluate_preference`). The training loop and `jaxrl-llm eval` both call
    it, so the command reproduces the run's logged eval metrics.

    Examples:
      >>> from types import SimpleNamespace
      >>> ctx = SimpleNamespace(task=SimpleNamespace(eval=[]), config=SimpleNamespace(kind="rl"),
      ...                       preference_eval_examples=None)
      >>> state = SimpleNamespace(params={"policy": None}, frozen={"policy": None})
      >>> evaluate_state(ctx, state, key=None)
      {}
    """
    policy, frozen = state.params["policy"], state.frozen["policy"]
    metrics = evaluate_policy(ctx, policy, frozen, key)
    if ctx.config.kind == "sft":
        metrics.update(evaluate_sft(ctx, policy, frozen))
    return {**metrics, **evaluate_preference(ctx, state)}


def evaluate_sft(ctx: RunContext, params: Any, frozen: Any) -> dict[str, float]:
    """The held-out NLL of an SFT run (module docstring): the eval subset's pairs whose answer
    and EOS fit the completion budget, in batches of `train.prompts_per_step` (the last one
    padded with rows that hold no target), with the policy's parameters.

    Returns:
      `{"eval/sft/nll", "eval/sft/tokens"}`; `{}` when no eval pair fits.

    Examples:
      >>> from types import SimpleNamespace
      >>> evaluate_sft(SimpleNamespace(task=SimpleNamespace(eval=[])), params=None, frozen=None)
      {}
    """
    pairs = [e for e in ctx.task.eval if answer_fits(ctx.task, e, ctx.config, ctx.tokenizer)]
    if not pairs:
        return {}
    B = ctx.config.train.prompts_per_step
    run = nll_program(ctx.graphs.policy, ctx.config.sft.chunk_size)
    total = tokens = 0.0
    with jax.set_mesh(ctx.mesh):
        for first in range(0, len(pairs), B):
            batch = sft_batch(ctx.task, pairs[first : first + B], ctx.config, ctx.tokenizer)
            batch = pad_rows(batch, B, ctx.tokenizer.pad_id)  # the last batch: empty rows
            batch = place_batch(batch, ctx.mesh)
            nll, count = fetch_global(run(params, frozen, batch))
            total, tokens = total + float(nll), tokens + float(count)
    return {"eval/sft/nll": total / max(tokens, 1.0), "eval/sft/tokens": tokens}
