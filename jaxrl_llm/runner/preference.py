"""Offline preference runs (`preference:`): DPO, RPO, SimPO, CPO, ORPO, KTO and BCO in the loop.

The records come from `data.source`: a `jsonl:PATH` file (`{"prompt", "chosen", "rejected"}`,
KTO `{"prompt", "completion", "label"}`) or `arithmetic` (pairs generated from the task,
the right answer preferred: `jaxrl_llm.data.arithmetic_preference_records`). They are
tokenized once (`preference_data:`, truncation counted). Per step:

    B examples from the resumable iterator  →  make_preference_batch (bucketed P, T)
      →  pack_preference_batch (`preference.packing`, `reward_model.packing`: several pairs
         per row, no padding)
      →  prepare_preference_batch (reference log-probs, KTO's reference point, BCO's
         running reward mean δ, kept in `TrainState.reward_moments`); with
         `preference.precompute_reference` the reference log-probs come from a table built
         once when the run starts (`precompute_reference`), and no reference copy is kept
      →  the compiled update step of `preference_objective`

The reference policy is the initial policy (a copy of its trainable parameters). Evaluation
(greedy / temperature-1 accuracy, pass@k) runs when the data has a prompt/answer eval split:
the arithmetic task's, or `data.eval_source` next to a JSONL file. Held-out preference
examples (`data.preference_eval_source`, or the arithmetic eval problems as pairs) are scored
at the same points by the objective itself, as TRL's preference trainers evaluate:

    eval/<metric>   mean over whole batches of the update step's metrics on held-out
                    examples (eval/pref/accuracy, eval/loss/preference, eval/pref/margin, ...)
"""

from __future__ import annotations

import logging
import time
from typing import Any

import jax
import numpy as np

from jaxrl_llm.data import (
    IteratorState,
    arithmetic_preference_records,
    load_preference_data,
    make_preference_batch,
    next_batch,
    parse_source,
)
from jaxrl_llm.runner.config import RunConfig
from jaxrl_llm.runner.context import RunContext, reference_policy
from jaxrl_llm.runner.programs import (
    logprob_program,
    preference_eval_program,
    preference_prepare_program,
)
from jaxrl_llm.train import (
    PreferenceBatch,
    TrainState,
    pack_preference_batch,
    precompute_reference_logprobs,
)
from jaxrl_llm.train.metrics import COUNT, with_derived_margin
from jaxrl_llm.train.pair_packing import packing_fill
from jaxrl_llm.train.shardings import place_batch
from sharding import fetch_global

log = logging.getLogger(__name__)


def _unpaired(config: RunConfig) -> bool:
    """KTO's labelled completions; pairs for the other losses (BCO included) and reward models."""
    return config.preference is not None and not config.preference.paired


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
    unpaired = _unpaired(config)
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
        "data/tied_pairs": stats.tied,
    }
    return examples, info


def load_preference_eval_examples(config: RunConfig, tokenizer: Any) -> list[Any]:
    """The held-out preference examples scored at each evaluation: `data.preference_eval_source`
    (`jsonl:PATH`), else the arithmetic task's eval problems as pairs when the data is
    `arithmetic`, else none; the first `train.eval_prompts` of them, cut to whole batches of
    `train.prompts_per_step` (every batch compiles to one shape).

    Examples:
      >>> from jaxrl_llm.runner.config import ModelSection, TrainConfig
      >>> from jaxrl_llm.data import ArithmeticConfig, DataConfig
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> from jaxrl_llm.train import PreferenceConfig
      >>> cfg = RunConfig(model=ModelSection(checkpoint="/m"), preference=PreferenceConfig(),
      ...     data=DataConfig(arithmetic=ArithmeticConfig(max_digits=1, eval_size=10)),
      ...     train=TrainConfig(prompts_per_step=4, eval_prompts=9))
      >>> len(load_preference_eval_examples(cfg, ByteTokenizer()))  # 9 → 2 batches of 4
      8
    """
    kind, _ = parse_source(config.data.source)
    unpaired = _unpaired(config)
    if config.data.preference_eval_source is not None:
        source: Any = parse_source(config.data.preference_eval_source, "preference_eval_source")[1]
    elif kind == "arithmetic":
        source = arithmetic_preference_records(
            config.data.arithmetic, split="eval", seed=config.data.seed, unpaired=unpaired
        )
    else:
        return []
    examples, _, _ = load_preference_data(
        source, tokenizer=tokenizer, config=config.preference_data, unpaired=unpaired
    )
    examples = examples[: config.train.eval_prompts]
    B = config.train.prompts_per_step
    if examples and len(examples) < B:
        log.warning(
            "preference evaluation: %d held-out examples (train.eval_prompts = %d) are fewer "
            "than one batch of train.prompts_per_step = %d: no preference metrics are "
            "evaluated; raise train.eval_prompts to at least %d",
            len(examples),
            config.train.eval_prompts,
            B,
            B,
        )
    return examples[: len(examples) // B * B]


def precompute_reference(
    config: RunConfig,
    graphs: Any,
    reference: Any,
    frozen: Any,
    mesh: Any,
    examples: dict[str, list[Any]],
    pad_id: int,
) -> dict[str, Any]:
    """`RunContext.reference_logprobs`: the reference's sequence log-probs of the train and
    eval examples (`preference.precompute_reference`), in batches of `train.prompts_per_step`
    on the run's mesh (`jaxrl_llm.train.precompute_reference_logprobs`).

    Examples:
      >>> from flax import nnx
      >>> from jaxrl_llm.data import ArithmeticConfig, DataConfig
      >>> from jaxrl_llm.models import Decoder, ModelConfig
      >>> from jaxrl_llm.runner.config import ModelSection, TrainConfig
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> from jaxrl_llm.train import PreferenceConfig, split_models
      >>> from sharding import make_mesh
      >>> tiny = ModelConfig(family="qwen3", vocab_size=259, hidden_size=8,
      ...                    intermediate_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
      ...                    head_dim=4)
      >>> cfg = RunConfig(model=ModelSection(init=tiny),
      ...     preference=PreferenceConfig(precompute_reference=True),
      ...     data=DataConfig(arithmetic=ArithmeticConfig(max_digits=1, train_size=3)),
      ...     train=TrainConfig(prompts_per_step=2))
      >>> examples, _ = load_preference_examples(cfg, ByteTokenizer())
      >>> graphs, params, frozen = split_models(Decoder(tiny, rngs=nnx.Rngs(0)))
      >>> tables = precompute_reference(cfg, graphs, params["policy"], frozen["policy"],
      ...     make_mesh(cfg.mesh), {"train": examples}, pad_id=ByteTokenizer().pad_id)
      >>> chosen, rejected = tables["train"]
      >>> chosen.shape, bool((chosen < 0).all() and (rejected < 0).all())
      ((3,), True)
    """
    pref = config.preference
    logprob_fn = logprob_program(graphs.policy, 1.0, pref.chunk_size, pref.prompt_group_size)
    tables = {}
    with jax.set_mesh(mesh):
        for split, items in examples.items():
            tables[split] = precompute_reference_logprobs(
                pref,
                items,
                logprob_fn=logprob_fn,
                ref_params=reference,
                frozen=frozen,
                pad_id=pad_id,
                data_config=config.preference_data,
                batch_size=config.train.prompts_per_step,
                place=lambda b: place_batch(b, mesh),
            )
    return tables


def _prepared_batch(
    ctx: RunContext,
    state: TrainState,
    examples: list[Any],
    references: tuple[np.ndarray, np.ndarray] | None = None,
    *,
    evaluation: bool = False,
) -> tuple[PreferenceBatch, Any]:
    """The bucketed batch of `examples` with its reference quantities (reference log-probs,
    KTO's reference point, BCO's shift), rows over the batch axes; and BCO's moments after it
    (None for the other losses). `references`: the examples' precomputed reference log-probs
    (`preference.precompute_reference`). `evaluation`: BCO's shift is the one training reached
    (the moments do not move, and no policy forward runs for them). Call under the run's mesh."""
    config = ctx.config
    batch = make_preference_batch(
        examples, pad_id=ctx.tokenizer.pad_id, config=config.preference_data
    )
    section = config.preference or config.reward_model  # `packing`: for the update's split
    parts = 1 if evaluation else section.minibatches * config.optim.accumulation_steps
    batch = pack_preference_batch(section, batch, parts=parts, pad_id=ctx.tokenizer.pad_id)
    if references is not None:
        batch = batch._replace(ref_chosen_logp=references[0], ref_rejected_logp=references[1])
    if evaluation and state.reward_moments is not None:  # BCO
        shift = np.full(len(examples), float(fetch_global(state.reward_moments.mean)))
        batch = batch._replace(reward_shift=shift.astype(np.float32))
    batch = place_batch(batch, ctx.mesh)
    if config.preference is None:  # a reward model: the pairs alone
        return batch, None
    prepare = preference_prepare_program(config.preference, ctx.graphs.policy)
    batch, moments = prepare(
        batch,
        state.params["policy"],
        None if references is not None else reference_policy(ctx, state),
        state.frozen["policy"],
        state.reward_moments,
    )
    # the per-row fields prepared here (KTO's reference point, BCO's shift) are built
    # replicated: rows over the batch axes, as the update step takes them
    return place_batch(batch, ctx.mesh), moments


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
    chosen = [examples[i] for i in indices]
    tokens = float(sum(len(e.chosen) + len(e.rejected or ()) for e in chosen))
    references = _table_rows(ctx, "train", np.asarray(indices))
    with jax.set_mesh(ctx.mesh):
        before = state.reward_moments  # not donated: the step gets the updated moments
        batch, moments = _prepared_batch(ctx, state, chosen, references)
        state = state._replace(reward_moments=moments)  # BCO's shift δ: checkpointed with it
        update_start = time.perf_counter()
        state, metrics = ctx.update(state, batch)
        metrics = {k: float(v) for k, v in fetch_global(metrics).items()}
        if metrics.get("optim/skipped", 0.0) > 0:  # a skipped step leaves δ's statistics too
            state = state._replace(reward_moments=before)
    done = time.perf_counter()
    if batch.packed is not None:  # the share of the packed rows' slots holding a token
        metrics["perf/packing_fill"] = packing_fill(batch.packed)
    metrics.update(
        {
            "time/forward_s": update_start - started,
            "time/update_s": done - update_start,
            "time/step_s": done - started,
            "perf/tokens_per_sec": tokens / max(done - started, 1e-9),
        }
    )
    return state, data, metrics


def _table_rows(
    ctx: RunContext, split: str, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """The precomputed reference log-probs of `rows` of a split, or None without a table."""
    if ctx.reference_logprobs is None:
        return None
    chosen, rejected = ctx.reference_logprobs[split]
    return chosen[rows], rejected[rows]


def evaluate_preference(ctx: RunContext, state: TrainState) -> dict[str, float]:
    """The objective's metrics on the held-out preference examples (module docstring):
    `eval/<metric>` for each metric of the update step's objective (`eval/pref/accuracy`,
    `eval/loss/preference`, `eval/pref/margin`, ...), the mean over whole batches (a metric
    with its own weight, such as KTO's per-side `count/pref/reward_chosen`, weighted by it;
    `pref/margin` the difference of the two sides, as the update step reduces them), with the
    parameters and BCO's shift of `state` (evaluation moves neither); `{}` without examples.

    Examples:
      >>> from types import SimpleNamespace
      >>> evaluate_preference(SimpleNamespace(preference_eval_examples=[]), state=None)
      {}
    """
    examples = ctx.preference_eval_examples
    if not examples:
        return {}
    started = time.perf_counter()
    B = ctx.config.train.prompts_per_step
    run = preference_eval_program(ctx.config.objective, ctx.graphs)
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    with jax.set_mesh(ctx.mesh):
        for first in range(0, len(examples), B):
            rows = np.arange(first, first + B)
            batch, _ = _prepared_batch(
                ctx,
                state,
                examples[first : first + B],
                _table_rows(ctx, "eval", rows),
                evaluation=True,
            )
            metrics = fetch_global(run(state.params, state.frozen, batch))
            for key, value in metrics.items():
                if key.startswith(COUNT):
                    continue
                weight = float(metrics.get(COUNT + key, 1.0))
                sums[key] = sums.get(key, 0.0) + float(value) * weight
                weights[key] = weights.get(key, 0.0) + weight
    means = {key: total / weights[key] if weights[key] else 0.0 for key, total in sums.items()}
    out = {f"eval/{key}": value for key, value in with_derived_margin(means).items()}
    out["eval/preference_examples"] = float(len(examples))
    out["time/preference_eval_s"] = time.perf_counter() - started
    return out
