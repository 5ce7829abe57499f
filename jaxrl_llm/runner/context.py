"""`RunContext`: what a run fixes when it starts (everything but the train state and the data
position), passed to the step functions. A plain NamedTuple: no methods, no mutable state.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any, NamedTuple

from jax.sharding import Mesh

from jaxrl_llm.runner.config import RunConfig
from jaxrl_llm.runner.task import TaskData
from jaxrl_llm.sampler import SamplingConfig
from jaxrl_llm.train import ModelGraphs


class RunContext(NamedTuple):
    """The static parts of a run.

    Attributes:
      config: the validated `RunConfig`.
      tokenizer: the run's tokenizer.
      task: the tokenized data and the fixed lengths `P`, `A`, `T`.
      graphs: the model graphs (`split_models`).
      mesh: the device mesh every program runs under.
      sampling: the training sampler's config, with the tokenizer's EOS among the stop tokens
        and its pad id as the filler.
      reward_functions: the resolved reward functions (empty with in-graph rewards).
      reference: the frozen reference policy's trainable parameters (None without a
        reference, and with `train.reference_sync`, where the state holds it:
        `reference_policy`).
      update: the compiled update step.
      run_dir: the run directory.
      update_row_groups: the row groups `update` computes its gradient in
        (`jaxrl_llm.train.row_groups`; 1: one call); a step whose groups run packed
        (`train.pack_groups`) packs them in as many parts.
      preference_examples: the tokenized preference examples (`preference:` runs), else None.
      preference_eval_examples: the held-out preference examples scored at each evaluation
        (whole batches; `preference:` runs), else None.
      reference_logprobs: with `preference.precompute_reference`, the reference's sequence
        log-probs of every example, `{"train": (chosen[n], rejected[n]), "eval": ...}` in the
        order of the example lists (`runner.preference.precompute_reference`); else None.

    Examples:
      >>> RunContext(*([None] * 10)).run_dir is None
      True
    """

    config: RunConfig
    tokenizer: Any
    task: TaskData
    graphs: ModelGraphs
    mesh: Mesh
    sampling: SamplingConfig
    reward_functions: list[Any]
    reference: Any
    update: Callable[..., Any]
    run_dir: pathlib.Path
    update_row_groups: int = 1
    preference_examples: list[Any] | None = None
    preference_eval_examples: list[Any] | None = None
    reference_logprobs: dict[str, Any] | None = None


def reference_policy(ctx: RunContext, state: Any) -> Any:
    """The reference policy's trainable parameters at this point of the run: the train state's
    (`train.reference_sync` moves them) or the context's frozen copy of the initial policy.

    Examples:
      >>> from types import SimpleNamespace
      >>> reference_policy(SimpleNamespace(reference="initial"), SimpleNamespace(reference=None))
      'initial'
    """
    return ctx.reference if state.reference is None else state.reference


def iterated_examples(ctx: RunContext) -> int:
    """`M`, the number of examples the run's data iterator walks (`IteratorState` is a
    position in an order of `M` examples): the preference pairs of `preference:` and
    `reward_model:` runs, the supervised examples of `sft:` runs, the prompts of RL runs.

    Examples:
      >>> from types import SimpleNamespace
      >>> task = SimpleNamespace(train=list(range(7)), sft_train=list(range(5)))
      >>> rl = RunContext(SimpleNamespace(kind="rl"), None, task, *([None] * 7))
      >>> iterated_examples(rl), iterated_examples(rl._replace(config=SimpleNamespace(kind="sft")))
      (7, 5)
    """
    kind = ctx.config.kind
    if kind in ("preference", "reward_model"):
        return len(ctx.preference_examples)
    return len(ctx.task.sft_train if kind == "sft" else ctx.task.train)
