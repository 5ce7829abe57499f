"""Offline preference runs (`preference:`): DPO, RPO, SimPO, CPO, ORPO, KTO and BCO in the loop.

The records come from `data.source`: a `jsonl:PATH` file (`{"prompt", "chosen", "rejected"}`,
KTO `{"prompt", "completion", "label"}`) or `arithmetic` (pairs generated from the task,
the right answer preferred: `jaxrl_llm.data.arithmetic_preference_records`). They are
tokenized once (`preference_data:`, truncation counted). Per step:

    B examples from the resumable iterator  →  make_preference_batch (bucketed P, T)
      →  prepare_preference_batch (reference log-probs, KTO's reference point, BCO's
         running reward mean δ, kept in `TrainState.reward_moments`)
      →  the compiled update step of `preference_objective`

The reference policy is the initial policy (a copy of its trainable parameters). Evaluation
(greedy / temperature-1 accuracy, pass@k) runs when the data has a prompt/answer eval split:
the arithmetic task's, or `data.eval_source` next to a JSONL file.
"""

from __future__ import annotations

import time
from typing import Any

import jax

from jaxrl_llm.data import (
    IteratorState,
    arithmetic_preference_records,
    load_preference_data,
    make_preference_batch,
    next_batch,
    parse_source,
)
from jaxrl_llm.runner.config import RunConfig
from jaxrl_llm.runner.context import RunContext
from jaxrl_llm.runner.programs import logprob_program
from jaxrl_llm.train import TrainState, prepare_preference_batch
from jaxrl_llm.train.shardings import batch_sharding
from sharding import fetch_global


def load_preference_examples(config: RunConfig, tokenizer: Any) -> tuple[list[Any], dict[str, int]]:
    """The run's tokenized preference examples and counts for the summary.

    Examples:
      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.data import ArithmeticConfig, DataConfig
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> from jaxrl_llm.train import PreferenceConfig
      >>> cfg = RunConfig(model=ModelSection(checkpoint="/m"), preference=PreferenceConfig(),
      ...     data=DataConfig(arithmetic=ArithmeticConfig(max_digits=1, train_size=4)))
      >>> examples, info = load_preference_examples(cfg, ByteTokenizer())
      >>> len(examples), info["data/preference_examples"], examples[0].rejected is not None
      (4, 4, True)
    """
    kind, path = parse_source(config.data.source)
    unpaired = not config.preference.paired
    if kind == "arithmetic":
        source: Any = arithmetic_preference_records(
            config.data.arithmetic, split="train", seed=config.data.seed, unpaired=unpaired
        )
    else:
        source = path
    examples, stats, issues = load_preference_data(
        source, tokenizer=tokenizer, config=config.preference_data, unpaired=unpaired
    )
    info = {
        "data/preference_examples": len(examples),
        "data/skipped_records": len(issues),
        "data/truncated_prompts": stats.prompt,
        "data/truncated_chosen": stats.chosen,
        "data/truncated_rejected": stats.rejected,
    }
    return examples, info


def _preference_step(
    ctx: RunContext, state: TrainState, data: IteratorState, step: int
) -> tuple[TrainState, IteratorState, dict[str, float]]:
    """One offline preference step (module docstring)."""
    del step
    config = ctx.config
    started = time.perf_counter()
    examples = ctx.preference_examples
    indices, data = next_batch(
        data,
        num_examples=len(examples),
        batch_size=config.train.prompts_per_step,
        shuffle=config.data.shuffle,
    )
    batch = make_preference_batch(
        [examples[i] for i in indices],
        pad_id=ctx.tokenizer.pad_id,
        config=config.preference_data,
    )
    tokens = float(batch.chosen.completion_mask.sum())
    if batch.rejected is not None:
        tokens += float(batch.rejected.completion_mask.sum())
    batch = jax.device_put(batch, batch_sharding(ctx.mesh))
    logprob = logprob_program(ctx.graphs.policy, 1.0, config.preference.chunk_size)
    with jax.set_mesh(ctx.mesh):
        batch, moments = prepare_preference_batch(
            config.preference,
            batch,
            logprob_fn=logprob,
            policy_params=state.params["policy"],
            ref_params=ctx.reference,
            frozen=state.frozen["policy"],
            reward_moments=state.reward_moments,
        )
        state = state._replace(reward_moments=moments)  # BCO's shift δ: checkpointed with it
        # the per-row fields prepared here (KTO's reference point, BCO's shift) are built
        # replicated: rows over the batch axes, as the update step takes them
        batch = jax.device_put(batch, batch_sharding(ctx.mesh))
        update_start = time.perf_counter()
        state, metrics = ctx.update(state, batch)
        metrics = {k: float(v) for k, v in fetch_global(metrics).items()}
    done = time.perf_counter()
    metrics.update(
        {
            "time/forward_s": update_start - started,
            "time/update_s": done - update_start,
            "time/step_s": done - started,
            "perf/tokens_per_sec": tokens / max(done - started, 1e-9),
        }
    )
    return state, data, metrics
