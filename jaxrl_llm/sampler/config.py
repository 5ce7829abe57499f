"""`SamplingConfig`: the static settings of one compiled sampler (a frozen, hashable dataclass).

Everything here is a Python value resolved at trace time, so the config is a static argument
of the compiled sampler and embeds in the training config (built from YAML with
`jaxrl_llm.config.build`). Traced per-call inputs (weights, prompts, keys, per-row budgets) are
arguments of `sample_tokens`, never config fields.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

from jaxrl_llm.sampler.stop_strings import StopStringTable, cached_stop_string_table

MIN_TEMPERATURE = 1e-6  # positive temperatures below it overflow float32 logits (use 0: greedy)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """Static settings of the sampler: budget, distribution controls, stop tokens, loop shape.

    The sampling distribution of a step is built from the float32 logits `z` in this order
    (the order of Hugging Face's logits warpers):

        z' = z / temperature                      (temperature = 0: greedy argmax of z)
        top_k:  keep the k largest z'
        top_p:  keep the smallest prefix (by decreasing probability) whose mass reaches p,
                measured on the distribution left by top_k
        min_p:  keep tokens with p(v) >= min_p · max_v p(v)

    Kept tokens are renormalised; ties at a cut-off are all kept. Nucleus sampling: "The Curious
    Case of Neural Text Degeneration" (arXiv 1904.09751); min-p: "Turning Up the Heat: Min-p
    Sampling for Creative and Coherent LLM Outputs" (arXiv 2407.01082).

    Attributes:
      max_new_tokens: global completion budget T (static; per-row budgets may be smaller).
      temperature: τ >= 0; 0 means greedy. A positive τ below 1e-6 (`MIN_TEMPERATURE`) is
        refused: `logits / τ` would overflow float32, and decoding is greedy there anyway.
      top_k: None (off) or k >= 1.
      top_p: None (off) or 0 < p <= 1.
      min_p: None (off) or 0 <= min_p <= 1.
      num_samples: G completions per prompt; the prompt is prefilled once and its KV cache
        broadcast to the G rows (rows are prompt-major: row `b·G + g`).
      stop_tokens: token ids that end a row (the stop token is part of the completion).
      stop_strings: texts that end a row once its completion's text contains one, however
        the tokens spell it (`sampler.stop_strings`; the tokens that complete it are part of
        the completion). They are matched by `stop_table`, which needs the tokenizer:
        `with_stop_strings(config, tokenizer)` builds it (`sample_texts` and the training
        runner do); `sample_tokens` refuses strings without their table.
      stop_table: the compiled matcher of `stop_strings` (`stop_string_table`); set by
        `with_stop_strings`, not by hand.
      pad_id: token id written after a row has stopped (never counted: its mask is 0).
      steps_per_loop: decode steps per `while_loop` iteration (partial unroll; the loop may
        run up to `steps_per_loop - 1` steps past the last row). XLA:CPU's loop overhead is
        small next to a decode step: 1 is as fast as 2, 4 or 8 and compiles the loop body
        once (0.4-0.5 s less than 4 on the benchmark models).
      unroll_loop_steps: True runs an iteration's `steps_per_loop` steps as one unrolled body
        (U copies of the step: compile time grows with U); False as an inner loop of fixed
        trip count U, which compiles the step once. Both check the stop condition once per
        U steps. On GPUs XLA runs a loop of known trip count without reading its condition
        back to the host (its `WhileThunk` takes the trip count), so the inner loop keeps
        the host-device round trip of the outer loop to one per U steps without unrolling.
        Tokens and log-probs do not depend on it.
      layer_unroll: decoder layers per iteration of the layer scan in prefill
        (`Decoder.decode_hidden(layer_unroll=...)`) and decode. A model with at most this
        many layers decodes them as a Python loop over per-layer weights sliced once before
        the loop and per-layer cache buffers written in place (`decode.decode_layers`);
        deeper models scan over the stacked layers and a stacked cache updated in place, in
        groups of the largest divisor of the depth that is at most this many layers per
        iteration. Unrolling removes a nested loop per step, at the price of compile time
        growing with it. On an H100, a 24-layer ~0.5B model decoded 1.78× faster as a
        Python loop over all its layers (`layer_unroll: 24`) than with the default 8, before
        the scan kept its cache stacked (it then copied the cache three times per step), for
        3× the compile time (benchmarks/results/gpu/h100.json).
      decode_phases: the decode loop runs as this many consecutive loops, phase `j` with a
        cache of `P + ends[j]` slots (the cache grows by empty slots between phases), so that
        attention reads the slots filled so far rather than all `P + T` in every step. Each
        phase compiles its own loop body (compile time grows about linearly with it). None
        (the default): one phase per 64 new tokens, at least 2 and at most 8
        (`resolved_decode_phases`): 2 up to 191 new tokens, 4 at 256, 8 from 512, where
        attention's share of a step grows with the length (docs/sampler.md: 2 phases +5-13%
        over 1 at 64-128 tokens; at 512 tokens 8 phases +16% (small) and +51% (tiny) over 2,
        for +1-2 s of compile). Tokens and log-probs do not depend on it.
      gather_weights: under a mesh with `fsdp > 1`, all-gather the FSDP-sharded weights once
        before decoding (each device then holds the weights split over `tensor` only, for the
        duration of the call) instead of in every decode step. False keeps them sharded and
        gathers per layer and step (for models whose `1/tensor` share does not fit a device).
        No effect without a mesh. False also keeps LoRA adapters unmerged (`merge_lora`).
      merge_lora: fold LoRA (and DoRA) adapters into their weights once per call, inside the
        program (`models.merge_lora`: `W + s·A·B`, float32, stored in `W`'s dtype), so that
        decoding runs the plain model: on the benchmark models (rank 16, every projection)
        unmerged adapters cost 8-18 % of the base model's tokens/s, merged ones 0-7 %. The
        merged weights of the adapted projections exist for the duration of the call (one more
        copy of them when the weights are not otherwise copied into a compute layout); False
        applies `s·(x·A)·B` at every token instead. No effect on models without adapters.
      bucket_multiple: prompt lengths are padded up to a multiple of this; None pads to the
        next power of two (at least `min_bucket`). Used by `generate` on the host.
      min_bucket: smallest padded prompt length.
      row_groups: host-side, not part of the compiled program: `generate` and the training
        runner split a call's prompts into this many equal groups and run each group's call
        from its own host thread, side by side on the CPU's cores
        (`jaxrl_llm.sampler.row_groups`; the same rollout as one call). The runner's
        step-by-step loop runs its log-prob forwards and, with one optimizer update per
        batch, the update's gradient in the same groups (`jaxrl_llm.train.row_groups`).
        None picks the largest divisor of the prompt count up to the core count on one CPU
        device that leaves each group enough work, 1 on accelerators and multi-device
        meshes. Must divide the prompts per call.

    Examples:
      >>> from jaxrl_llm.config import build
      >>> cfg = build(SamplingConfig, {"max_new_tokens": 32, "top_p": 0.9, "stop_tokens": [2]})
      >>> cfg.top_p, cfg.stop_tokens, cfg.greedy
      (0.9, (2,), False)
      >>> SamplingConfig(max_new_tokens=0)
      Traceback (most recent call last):
      ...
      ValueError: SamplingConfig: `max_new_tokens` must be an int >= 1, got 0.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    num_samples: int = 1
    stop_tokens: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    stop_table: StopStringTable | None = None
    pad_id: int = 0
    steps_per_loop: int = 1
    unroll_loop_steps: bool = True
    layer_unroll: int = 8
    decode_phases: int | None = None
    gather_weights: bool = True
    merge_lora: bool = True
    bucket_multiple: int | None = None
    min_bucket: int = 16
    row_groups: int | None = None

    @property
    def resolved_decode_phases(self) -> int:
        """`decode_phases`, or by default one phase per 64 new tokens within [2, 8].

        Examples:
          >>> [SamplingConfig(max_new_tokens=t).resolved_decode_phases for t in (16, 256, 2048)]
          [2, 4, 8]
          >>> SamplingConfig(max_new_tokens=2048, decode_phases=3).resolved_decode_phases
          3
        """
        if self.decode_phases is not None:
            return self.decode_phases
        return max(2, min(8, self.max_new_tokens // 64))

    def __post_init__(self) -> None:
        _python_numbers(self)
        for name in (
            "max_new_tokens",
            "num_samples",
            "steps_per_loop",
            "layer_unroll",
            "min_bucket",
        ):
            _check_int(self, name, low=1)
        if self.decode_phases is not None:
            _check_int(self, "decode_phases", low=1)
        _check_int(self, "pad_id", low=0)
        for name in ("gather_weights", "merge_lora", "unroll_loop_steps"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"SamplingConfig: `{name}` must be a bool, got {getattr(self, name)!r}."
                )
        if self.top_k is not None:
            _check_int(self, "top_k", low=1)
        if self.bucket_multiple is not None:
            _check_int(self, "bucket_multiple", low=1)
        if self.row_groups is not None:
            _check_int(self, "row_groups", low=1)
        if not _is_number(self.temperature) or not (
            math.isfinite(self.temperature) and self.temperature >= 0
        ):
            raise ValueError(
                f"SamplingConfig: `temperature` must be a finite number >= 0 (0 = greedy), "
                f"got {self.temperature!r}."
            )
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(
                f"SamplingConfig: `temperature` {self.temperature!r} is below {MIN_TEMPERATURE}: "
                "the logits divided by it overflow float32; use 0 (greedy decoding)."
            )
        if self.top_p is not None and not (_is_number(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(
                f"SamplingConfig: `top_p` must be in (0, 1] or None, got {self.top_p!r}."
            )
        if self.min_p is not None and not (_is_number(self.min_p) and 0 <= self.min_p <= 1):
            raise ValueError(
                f"SamplingConfig: `min_p` must be in [0, 1] or None, got {self.min_p!r}."
            )
        if not isinstance(self.stop_tokens, tuple) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_tokens
        ):
            raise ValueError(
                "SamplingConfig: `stop_tokens` must be a tuple of token ids >= 0, "
                f"got {self.stop_tokens!r}."
            )
        if not isinstance(self.stop_strings, tuple) or not all(
            isinstance(t, str) and t for t in self.stop_strings
        ):
            raise ValueError(
                "SamplingConfig: `stop_strings` must be a tuple of non-empty strings, "
                f"got {self.stop_strings!r}."
            )
        table = self.stop_table
        if table is not None and (
            not isinstance(table, StopStringTable) or table.strings != self.stop_strings
        ):
            raise ValueError(
                "SamplingConfig: `stop_table` does not match `stop_strings`; build it with "
                "`with_stop_strings(config, tokenizer)`."
            )
        object.__setattr__(self, "temperature", float(self.temperature))

    @property
    def greedy(self) -> bool:
        """Whether this config decodes greedily (temperature 0)."""
        return self.temperature == 0.0

    @property
    def filtered(self) -> bool:
        """Whether top-k, top-p or min-p change the sampling distribution."""
        return not self.greedy and (
            self.top_k is not None or self.top_p is not None or bool(self.min_p)
        )


def with_stop_strings(config: SamplingConfig, tokenizer: object) -> SamplingConfig:
    """`config` with the matcher of its `stop_strings` for `tokenizer`'s vocabulary (the config
    unchanged when it has none).

    Examples:
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> cfg = with_stop_strings(SamplingConfig(stop_strings=("</a>",)), ByteTokenizer())
      >>> cfg.stop_table.window, cfg.stop_table.states
      (4, 3)
    """
    if not config.stop_strings:
        return dataclasses.replace(config, stop_table=None)
    table = cached_stop_string_table(config.stop_strings, tokenizer)
    return dataclasses.replace(config, stop_table=table)


_INT_FIELDS = (
    "max_new_tokens",
    "num_samples",
    "steps_per_loop",
    "layer_unroll",
    "min_bucket",
    "decode_phases",
    "pad_id",
    "top_k",
    "bucket_multiple",
    "row_groups",
)


def _python_numbers(config: SamplingConfig) -> None:
    """NumPy scalars of the numeric fields as Python `int` / `float` (the config is a
    static argument: hashed and compared by value)."""

    def integer(value: object) -> bool:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)

    for name in _INT_FIELDS:
        if integer(value := getattr(config, name)):
            object.__setattr__(config, name, int(value))
    for name in ("temperature", "top_p", "min_p"):
        value = getattr(config, name)
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            object.__setattr__(config, name, int(value) if integer(value) else float(value))
    if isinstance(config.stop_tokens, tuple):
        stops = tuple(int(t) if integer(t) else t for t in config.stop_tokens)
        object.__setattr__(config, "stop_tokens", stops)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_int(config: SamplingConfig, name: str, *, low: int) -> None:
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"SamplingConfig: `{name}` must be an int >= {low}, got {value!r}.")
