"""The run's data, tokenized once: fixed prompt / answer / completion lengths, and the batches.

Every compiled program of a run has static shapes, so the padded lengths are fixed when the run
starts, from the whole train and eval splits:

    P = bucket_length(longest prompt that fits train.max_prompt_tokens)   prompts, BOS included
    A = longest reference answer                                          answer tokens
    T = sampling.max_new_tokens                                           completions

A prompt longer than `train.max_prompt_tokens` cannot be sampled within the budget: it is left
out of its split, counted (`TaskData.too_long_prompts`) and reported with a warning. For
supervised steps (an `sft:` run, or the warm start) a (prompt, answer) pair is the prompt
followed by the answer and EOS in the `T` completion slots; pairs whose answer does not fit are
left out of the supervised data the same way (`TaskData.too_long_answers`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxrl_llm.config import ConfigError
from jaxrl_llm.data import PromptBatch, load_split, make_prompt_batch, parse_source, render_prompt
from jaxrl_llm.data.records import DataError
from jaxrl_llm.runner.config import RunConfig
from jaxrl_llm.sampler.buckets import bucket_length
from jaxrl_llm.train import SequenceBatch, pack_batch

log = logging.getLogger(__name__)


class TaskData(NamedTuple):
    """The examples of a run and the static lengths of its batches.

    Attributes:
      train: train examples whose prompt fits the budget.
      eval: eval examples whose prompt fits (empty when the source has no eval split).
      sft_train: indices into `train` of the pairs whose answer + EOS fits `T`.
      prompt_length: `P`.
      answer_length: `A`.
      completion_length: `T`.
      too_long_prompts: examples left out because of their prompt, per split.
      too_long_answers: train pairs left out of supervised steps because of their answer.

    Examples:
      >>> t = TaskData([], [], np.zeros(0, int), 16, 3, 8, {"train": 0, "eval": 0}, 0)
      >>> t.prompt_length + t.completion_length
      24
    """

    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]
    sft_train: np.ndarray
    prompt_length: int
    answer_length: int
    completion_length: int
    too_long_prompts: dict[str, int]
    too_long_answers: int


def _has_eval_split(config: RunConfig) -> bool:
    if config.kind == "reward_model":  # a reward model does not generate: pairs only
        return False
    kind, _ = parse_source(config.data.source)
    return kind not in ("jsonl", "parquet") or config.data.eval_source is not None


def _prompt_lengths(examples: Sequence[dict], config: RunConfig, tokenizer: Any) -> np.ndarray:
    """Each example's prompt length in tokens; a prompt of no tokens is a `DataError` (the
    sampler and the forwards need a token to condition on)."""
    template = config.data.template
    lengths = np.asarray(
        [len(tokenizer.encode(render_prompt(e, template, tokenizer))) for e in examples], int
    )
    if len(lengths) and not lengths.min():
        i = int(np.argmin(lengths))
        raise DataError(
            f"data: example {i}'s prompt {render_prompt(examples[i], template, tokenizer)!r} has "
            f"no tokens ({int((lengths == 0).sum())} empty prompt(s)); give every example a "
            "prompt, or a template or tokenizer that adds a token."
        )
    return lengths


def _answer_ids(example: dict, config: RunConfig, tokenizer: Any) -> list[int]:
    return tokenizer.encode(str(example[config.data.answer_field]), add_bos=False)


def _fit(
    examples: list[dict], lengths: np.ndarray, budget: int | None, split: str
) -> tuple[list[dict], np.ndarray, int]:
    if budget is None:
        return examples, lengths, 0
    keep = lengths <= budget
    dropped = int((~keep).sum())
    if dropped:
        first = examples[int(np.argmin(keep))]
        log.warning(
            "%s split: left out %d of %d examples whose prompt is longer than "
            "train.max_prompt_tokens=%d tokens (first: %r).",
            split,
            dropped,
            len(examples),
            budget,
            first,
        )
    return [e for e, k in zip(examples, keep, strict=True) if k], lengths[keep], dropped


def load_task(config: RunConfig, tokenizer: Any) -> TaskData:
    """Load both splits, drop prompts over the budget, and fix `P`, `A` and `T`.

    Args:
      config: the run config (`data`, `train.max_prompt_tokens`, `train.eval_prompts`,
        `sampling.max_new_tokens`, its bucketing).
      tokenizer: the run's tokenizer.

    Returns:
      `TaskData`; `eval` holds the first `train.eval_prompts` eval examples.

    Raises:
      ConfigError: no train example fits the prompt budget.

    Examples:
      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.data import DataConfig, ArithmeticConfig
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> from jaxrl_llm.train import SFTConfig
      >>> cfg = RunConfig(model=ModelSection(checkpoint="/m"), sft=SFTConfig(),
      ...     data=DataConfig(arithmetic=ArithmeticConfig(max_digits=1, train_size=8, eval_size=4)))
      >>> task = load_task(cfg, ByteTokenizer())
      >>> len(task.train), len(task.eval), task.prompt_length, task.answer_length
      (8, 4, 16, 2)
    """
    budget = config.train.max_prompt_tokens
    source_kind, _ = parse_source(config.data.source)
    # a preference run's JSONL holds preference records: only its eval split is a task split
    preference_file = config.offline_pairs and source_kind == "jsonl"
    train = [] if preference_file else load_split(config.data, "train")
    train_len = _prompt_lengths(train, config, tokenizer)
    train, train_len, dropped_train = _fit(train, train_len, budget, "train")
    if not train and not preference_file:
        raise ConfigError(
            f"train.max_prompt_tokens: no train prompt fits in {budget} tokens; raise the budget."
        )
    evals: list[dict] = []
    dropped_eval = 0
    if _has_eval_split(config):
        evals = load_split(config.data, "eval")
        eval_len = _prompt_lengths(evals, config, tokenizer)
        evals, eval_len, dropped_eval = _fit(evals, eval_len, budget, "eval")
        evals = evals[: config.train.eval_prompts]
        train_len = np.concatenate([train_len, eval_len[: len(evals)]])
    longest = int(train_len.max()) if len(train_len) else 1
    P = bucket_length(
        longest, multiple=config.sampling.bucket_multiple, minimum=config.sampling.min_bucket
    )
    if budget is not None:
        P = min(P, max(budget, longest))
    answers = [_answer_ids(e, config, tokenizer) for e in train + evals]
    A = max(1, max((len(a) for a in answers), default=1))
    T = config.sampling.max_new_tokens
    fits = np.asarray([_fits_completion(a, T) for a in answers[: len(train)]], bool)
    sft_train = np.flatnonzero(fits)
    too_long_answers = int((~fits).sum())
    needs_pairs = config.kind == "sft" or config.warm_start is not None
    if needs_pairs and too_long_answers:
        log.warning(
            "left %d of %d train pairs out of supervised steps: answer + EOS is longer than "
            "sampling.max_new_tokens=%d tokens.",
            too_long_answers,
            len(train),
            T,
        )
    if needs_pairs and not len(sft_train):
        raise ConfigError(
            f"sampling.max_new_tokens: no train answer (+ EOS) fits in {T} tokens, so there is "
            "nothing to fine-tune on; raise max_new_tokens."
        )
    for name, section in (("sft", config.sft), ("warm_start", config.warm_start)):
        length = getattr(section, "packing_length", None)
        if length is not None and length < P + T:
            raise ConfigError(
                f"{name}.packing_length: {length} slots per packed row are fewer than a "
                f"padded pair's P + T = {P} + {T} = {P + T}; use at least {P + T} or null."
            )
    return TaskData(
        train=train,
        eval=evals,
        sft_train=sft_train,
        prompt_length=P,
        answer_length=A,
        completion_length=T,
        too_long_prompts={"train": dropped_train, "eval": dropped_eval},
        too_long_answers=too_long_answers,
    )


def answer_fits(task: TaskData, example: dict, config: RunConfig, tokenizer: Any) -> bool:
    """Whether the example's answer and EOS fit the completion budget `T` (a supervised pair).

    Examples:
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.train import SFTConfig
      >>> cfg = RunConfig(model=ModelSection(checkpoint="/m"), sft=SFTConfig())
      >>> task = TaskData([], [], np.zeros(0, int), 6, 2, 3, {}, 0)
      >>> [answer_fits(task, {"prompt": "", "answer": a}, cfg, ByteTokenizer()) for a in ("12", "123")]
      [True, False]
    """
    return _fits_completion(_answer_ids(example, config, tokenizer), task.completion_length)


def _fits_completion(answer_ids: Sequence[int], budget: int) -> bool:
    """The answer's tokens and the EOS that ends a supervised completion fit `budget` tokens."""
    return len(answer_ids) + 1 <= budget


def prompt_batch(
    task: TaskData, examples: Sequence[dict], config: RunConfig, tokenizer: Any
) -> PromptBatch:
    """The `PromptBatch` of `examples` at the run's fixed lengths (`[B, P]` and `[B, A]`).

    Examples:
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.train import SFTConfig
      >>> cfg = RunConfig(model=ModelSection(checkpoint="/m"), sft=SFTConfig())
      >>> task = TaskData([], [], np.zeros(0, int), 8, 3, 4, {}, 0)
      >>> b = prompt_batch(task, [{"prompt": "1+1=", "answer": "2"}], cfg, ByteTokenizer())
      >>> b.prompt_tokens.shape, b.answer_tokens.tolist()
      ((1, 8), [[50, 256, 256]])
    """
    try:
        return make_prompt_batch(
            examples,
            template=config.data.template,
            tokenizer=tokenizer,
            answer_field=config.data.answer_field,
            prompt_length=task.prompt_length,
            answer_length=task.answer_length,
        )
    except DataError as err:  # the lengths were fixed from these very examples
        raise RuntimeError(
            f"prompt_batch: an example no longer fits the run's lengths: {err}"
        ) from err


def sft_batch(
    task: TaskData, examples: Sequence[dict], config: RunConfig, tokenizer: Any
) -> SequenceBatch:
    """(prompt, answer) pairs as a `SequenceBatch`: prompt left-padded to `P`, then answer + EOS
    right-padded to `T`; the completion mask covers the answer and the EOS.

    Examples:
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.train import SFTConfig
      >>> cfg = RunConfig(model=ModelSection(checkpoint="/m"), sft=SFTConfig())
      >>> task = TaskData([], [], np.zeros(0, int), 6, 2, 4, {}, 0)
      >>> b = sft_batch(task, [{"prompt": "1+1=", "answer": "2"}], cfg, ByteTokenizer())
      >>> b.tokens.tolist(), b.completion_mask.tolist()
      ([[256, 257, 49, 43, 49, 61, 50, 258, 256, 256]], [[1.0, 1.0, 0.0, 0.0]])
    """
    prompts = prompt_batch(task, examples, config, tokenizer)
    T = task.completion_length
    B = len(examples)
    completion = np.full((B, T), tokenizer.pad_id, np.int32)
    mask = np.zeros((B, T), np.float32)
    for i, example in enumerate(examples):
        ids = [*_answer_ids(example, config, tokenizer), tokenizer.eos_id]
        if len(ids) > T:
            raise ValueError(
                f"sft_batch: answer {example[config.data.answer_field]!r} + EOS has {len(ids)} "
                f"tokens, more than the completion budget T={T}."
            )
        completion[i, : len(ids)] = ids
        mask[i, : len(ids)] = 1.0
    tokens = np.concatenate([prompts.prompt_tokens, completion], axis=1)
    attention = np.concatenate([prompts.prompt_mask, mask > 0], axis=1).astype(np.int32)
    return SequenceBatch(tokens=tokens, attention_mask=attention, completion_mask=mask)


def packed_sft_batch(
    task: TaskData, batch: SequenceBatch, *, length: int | None, unit: int, pad_id: int
) -> SequenceBatch:
    """`sft_batch`'s pairs packed several to a row (`sft.packing`, `warm_start.packing`;
    `jaxrl_llm.train.pack_batch`).

    Rows of `length` slots (None: `P + T`); their count is the smallest `unit · 2^k` that
    holds the packing, at most the `B` padded rows (`unit`: the rows every update step needs a
    multiple of, `packing_row_unit`), so a run compiles one update program per count it meets,
    `log2(B / unit) + 1` at most.

    Examples:
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.train import SFTConfig
      >>> cfg = RunConfig(model=ModelSection(checkpoint="/m"), sft=SFTConfig(packing=True))
      >>> task = TaskData([], [], np.zeros(0, int), 6, 2, 4, {}, 0)
      >>> pairs = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
      >>> b = sft_batch(task, pairs, cfg, ByteTokenizer())
      >>> p = packed_sft_batch(task, b, length=None, unit=1, pad_id=256)
      >>> p.tokens.shape, p.segment_ids.tolist()  # 7 real tokens each: one row of 10 each
      ((2, 10), [[1, 1, 1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 0, 0, 0]])
    """
    length = length or task.prompt_length + task.completion_length
    packed = pack_batch(batch, length=length, pad_id=pad_id)
    rows = unit
    while rows < packed.tokens.shape[0]:
        rows *= 2
    return pad_rows(packed, min(rows, batch.tokens.shape[0]), pad_id)


def packing_row_unit(parts: int, batch_devices: int, parallel: str) -> int:
    """The rows a packed batch needs a multiple of: `parts = minibatches × accumulation_steps`
    micro-batches, split over `batch_devices` (their least common multiple under
    `parallel: jit`; under `pmap` every device splits its own rows, so their product).

    Examples:
      >>> packing_row_unit(2, 4, "jit"), packing_row_unit(2, 4, "pmap")
      (4, 8)
    """
    return parts * batch_devices if parallel == "pmap" else math.lcm(parts, batch_devices)


def pad_rows(batch: SequenceBatch, rows: int, pad_id: int) -> SequenceBatch:
    """`batch` with rows of padding appended up to `rows`: `pad_id` tokens, no attention, no
    target (and segment 0), so that no loss or count sees them.

    Examples:
      >>> b = SequenceBatch(np.ones((1, 3), np.int32), np.ones((1, 3)), np.ones((1, 2)))
      >>> padded = pad_rows(b, 2, pad_id=9)
      >>> padded.tokens.tolist(), padded.completion_mask.tolist()
      ([[1, 1, 1], [9, 9, 9]], [[1.0, 1.0], [0.0, 0.0]])
    """
    extra = rows - batch.tokens.shape[0]
    if extra < 0:
        raise ValueError(f"pad_rows: the batch has {batch.tokens.shape[0]} rows, more than {rows}.")
    return SequenceBatch(
        *(
            None if x is None else np.pad(x, [(0, extra), (0, 0)], constant_values=fill)
            for x, fill in zip(batch, (pad_id, 0, 0, 0), strict=True)
        )
    )
