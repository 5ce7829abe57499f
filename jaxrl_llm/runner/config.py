"""`RunConfig`: the whole training run in one frozen dataclass, built from YAML and validated on load.

The component configs are embedded unchanged (`DataConfig`, `RewardConfig`, `AlgorithmConfig`,
`SFTConfig`, `OptimConfig`, `SamplingConfig`, `CheckpointConfig`, `MetricsConfig`,
`MeshConfig`); this module adds the sections that only a run has (`model`, `tokenizer`,
`train`, `warm_start`, `export`) and the constraints *between* sections, checked before any
model is built or any program compiled:

    exactly one of algorithm: (RL), sft: (supervised), preference: (offline DPO, ...) and
      reward_model: (Bradley-Terry reward-model training)
    grouped estimators / drop_zero_variance / decoupled rewards  need sampling.num_samples >= 2
    algorithm.temperature == sampling.temperature (the log-probs score the sampler's policy)
    N = prompts_per_step · G  divisible by  minibatches · accumulation_steps;
      prompts_per_step  divisible by  data · fsdp  (prefill splits the prompts)
      (online DPO: its B pairs, minibatch_unit prompt: its B prompts, divisible by
      minibatches · accumulation_steps)
    sampling.row_groups  divides prompts_per_step
    rewards.jax_native  only on the built-in tasks, and not with sampling.stop_strings
    rewards.combine: decoupled  only with the group estimator and no KL in the reward
    rewards.on_failure: drop_group  not with advantage.scale: batch (filler rewards would enter
                                    the batch std)
    parallel: pmap  mesh fsdp = tensor = 1, not with train.compiled_iterations; each device's
                    rows (N / data) divisible by minibatches · accumulation_steps (whole
                    pairs or prompts, as above)
    train.compiled_iterations  RL with in-graph rewards and no DAPO refills; train.eval_every and
                               checkpoint.every multiples of it

Every error is a `ConfigError` whose message starts with the key path (`train.prompts_per_step:
...`). `load_run_config` (`jaxrl_llm.runner.overrides`) reads the YAML and applies command-line
overrides first.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from typing import Any, Literal

from jaxrl_llm.checkpoint import CheckpointConfig
from jaxrl_llm.config import ConfigError, build  # noqa: F401 (doctests)
from jaxrl_llm.data import DataConfig, PreferenceDataConfig, parse_source
from jaxrl_llm.metrics_log import MetricsConfig
from jaxrl_llm.models import LoRAConfig, ModelConfig, check_fused_attention
from jaxrl_llm.rewards import RewardConfig
from jaxrl_llm.sampler import SamplingConfig
from jaxrl_llm.train import (
    AlgorithmConfig,
    OptimConfig,
    PreferenceConfig,
    RewardModelConfig,
    SFTConfig,
)
from jaxrl_llm.train.algorithms import GROUPED_ESTIMATORS, keeps_row_subset
from sharding import MeshConfig

log = logging.getLogger(__name__)

DType = Literal["float32", "bfloat16"]
BUILTIN_TASKS = ("arithmetic", "sorting")
BYTE_VOCAB = 259  # ByteTokenizer: 256 bytes + pad, bos, eos
OBJECTIVE_SECTIONS = ("algorithm", "sft", "preference", "reward_model")  # exactly one is set


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSection:
    """The `model:` section: where the policy comes from and how it computes.

    Attributes:
      checkpoint: a local Hugging Face checkpoint directory (`from_pretrained`).
      init: a random model of this architecture (a `ModelConfig` mapping), initialised from
        the run's `seed`; exactly one of `checkpoint` and `init`.
      dtype: compute dtype.
      param_dtype: storage dtype of the parameters.
      remat: per-layer rematerialisation: "dots" (default: keep the matmul outputs, recompute
        the rest; the fastest on XLA:CPU), "full" or "none" (see `Decoder`).
      attention_chunk: None (default) or an int: the training forwards and the prompts'
        prefill attend in blocks of this many queries, each recomputed in the backward pass
        (`Decoder`), so attention's float32 logits and probabilities take memory linear in
        the sequence length instead of quadratic; for long sequences on accelerators
        (docs/models.md).
      fused_attention: the training forwards attend through `jax.nn.dot_product_attention`:
        cuDNN's flash-attention kernel on NVIDIA GPUs with `dtype: bfloat16` (logits kept on
        chip), XLA's composition of the same math elsewhere, which on the CPU is slower than
        the default (`Decoder(fused_attention=True)`, docs/models.md; not for Gemma 2 / 3's
        sliding windows and soft-capping).
      trainable: regexes of the trainable parameter paths (`split_models`; () = all, or with
        `lora` the adapters, a reward model's scalar head and the critic; with `critic_lora`
        the critic's adapters and value head).
      frozen: regexes of parameter paths to freeze.
      lora: LoRA adapters on the policy's projections (`models.LoRAConfig`: rank, alpha,
        targets, use_rslora, use_dora), drawn with `seed + 2`; None: none. The export folds
        them into the weights (a plain checkpoint) and writes them alone in PEFT's format
        (`export/adapter`).
      lora_adapter: start from the LoRA adapters of a PEFT adapter directory instead
        (`adapter_config.json` + `adapter_model.safetensors`, e.g. an earlier run's
        `export/adapter` with its base `checkpoint`); not with `lora`.
      critic_checkpoint: the PPO critic (`critic.kind: model`) from this checkpoint
        (`*ForSequenceClassification` or a causal LM whose backbone gets a fresh head); None:
        the policy's checkpoint backbone with a fresh head, or a random critic of `init`.
      critic_lora: LoRA adapters on the PPO critic's projections (`critic.kind: model`; a
        `models.LoRAConfig`), drawn with `seed + 3`: the critic's adapters and its value head
        train, its backbone stays frozen (OpenRLHF's LoRA critic). None: the whole critic
        trains.

    Examples:
      >>> sec = build(ModelSection, {"init": {"family": "qwen3", "vocab_size": 259,
      ...     "hidden_size": 16, "intermediate_size": 32, "num_layers": 1, "num_heads": 2,
      ...     "num_kv_heads": 1, "head_dim": 8}})
      >>> sec.init.hidden_size, sec.dtype
      (16, 'float32')
      >>> ModelSection()
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: model: set exactly one of `checkpoint` (a local Hugging Face directory) and `init` (a random architecture), got neither.
    """

    checkpoint: str | None = None
    init: ModelConfig | None = None
    dtype: DType = "float32"
    param_dtype: DType = "float32"
    remat: Literal["none", "full", "dots"] = "dots"
    attention_chunk: int | None = None
    fused_attention: bool = False
    trainable: tuple[str, ...] = ()
    frozen: tuple[str, ...] = ()
    lora: LoRAConfig | None = None
    lora_adapter: str | None = None
    critic_checkpoint: str | None = None
    critic_lora: LoRAConfig | None = None

    def __post_init__(self) -> None:
        if (self.checkpoint is None) == (self.init is None):
            got = "both" if self.checkpoint is not None else "neither"
            raise ConfigError(
                "model: set exactly one of `checkpoint` (a local Hugging Face directory) and "
                f"`init` (a random architecture), got {got}."
            )
        if self.lora is not None and self.lora_adapter is not None:
            raise ConfigError(
                "model.lora_adapter: the adapter file sets rank, alpha and targets; remove "
                "model.lora (or model.lora_adapter)."
            )
        chunk = self.attention_chunk
        if chunk is not None and (
            isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1
        ):
            raise ConfigError(f"model.attention_chunk: must be null or an int >= 1, got {chunk!r}.")
        if self.fused_attention and self.init is not None:
            try:
                check_fused_attention(self.init)
            except ValueError as err:
                raise ConfigError(f"model.fused_attention: {err}") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenizerSection:
    """The `tokenizer:` section.

    Attributes:
      path: "byte" (`ByteTokenizer`, 259 ids) or a local tokenizer directory; None: the model
        checkpoint's directory.
      chat_template: render prompts with the tokenizer's chat template.

    Examples:
      >>> TokenizerSection().path
      'byte'
    """

    path: str | None = "byte"
    chat_template: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class OverlongConfig:
    """DAPO's soft overlong punishment added to the reward (`losses.overlong_penalty`).

        p(len) = 0 up to L₀ = max_length − buffer_length, then −factor·(len − L₀)/buffer_length,
                 −factor beyond max_length

    Source: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (arXiv 2503.14476).

    Attributes:
      buffer_length: width of the linear ramp in tokens.
      max_length: the length where the penalty reaches `−factor` (None: the sampler's
        `max_new_tokens`).
      factor: the penalty at `max_length`.

    Examples:
      >>> OverlongConfig(buffer_length=4).factor
      1.0
    """

    buffer_length: int
    max_length: int | None = None
    factor: float = 1.0

    def __post_init__(self) -> None:
        if self.buffer_length < 1:
            raise ConfigError(
                f"train.overlong.buffer_length: must be >= 1, got {self.buffer_length}."
            )
        if self.factor < 0:
            raise ConfigError(f"train.overlong.factor: must be >= 0, got {self.factor}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReferenceSyncConfig:
    """`train.reference_sync:` move the reference policy toward the policy during training.

    Every `every` steps, after the update, `π_ref ← α·π_θ + (1 − α)·π_ref` over the trainable
    parameters (`jaxrl_llm.train.sync_reference`): TR-DPO's soft update ("Learn Your Reference
    Model for Real Good Alignment", arXiv 2404.09656), TRL's `sync_ref_model` (defaults
    `ref_model_mixup_alpha=0.6`, `ref_model_sync_steps=512`, for DPO and GRPO alike); with
    `α = 1` the hard reference reset of ProRL ("ProRL: Prolonged Reinforcement Learning
    Expands Reasoning Boundaries in Large Language Models", arXiv 2505.24864). The reference
    then lives in the train state, so a checkpoint holds it and a resumed run continues with
    the synced one.

    Attributes:
      every: steps between syncs (`τ`).
      alpha: the mix-up weight `α` of the policy, in (0, 1].
      reset_optimizer: also restart the optimizer's state at each sync (its moments and step
        count, so a learning-rate schedule starts over), as ProRL's hard reset does.

    Examples:
      >>> build(ReferenceSyncConfig, {"every": 64}).alpha
      0.6
    """

    every: int
    alpha: float = 0.6
    reset_optimizer: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ConfigError(f"train.reference_sync.every: must be an int >= 1, got {self.every}.")
        if not 0.0 < self.alpha <= 1.0:
            raise ConfigError(f"train.reference_sync.alpha: must be in (0, 1], got {self.alpha}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The `train:` section: the loop's length, batch, evaluation, logging and safety limits.

    Attributes:
      steps: update steps of the run.
      prompts_per_step: `B`, prompts per step (RL: `B·G` sequences; SFT: `B` pairs).
      max_prompt_tokens: prompts longer than this (BOS included) are left out of the data
        with a warning (None: the longest prompt sets the padded length).
      eval_every: evaluate every this many steps (0: only before and after training).
      eval_prompts: size of the fixed eval subset (the first examples of the eval split); 0
        turns evaluation off.
      eval_samples: samples per eval prompt at temperature 1 (None: `sampling.num_samples`).
      eval_pass_k: the `k` of the reported pass@k (each <= the eval samples).
      log_every: write metrics every this many steps (the first and last steps always).
      max_refills: DAPO dynamic sampling (`advantage.drop_zero_variance`): extra prompt batches
        sampled per step at most, until `B` groups with a reward spread are collected.
      overlong: the soft overlong punishment (None: off).
      truncation_penalty: ProRL's "stop properly" penalty on completions that hit
        `sampling.max_new_tokens` without a stop token or string (`losses.truncation_penalty`
        on the total reward: `coef` in [0, 1] scales it, `coef < 0` replaces it; OpenRLHF's
        `stop_properly_penalty_coef`, close to TRL's `missing_eos_penalty`); None: off.
      max_consecutive_skips: stop the run after this many consecutive steps skipped for a
        non-finite loss or gradient.
      compiled_iterations: `K`: run the RL iterations (sample → in-graph reward → advantages →
        update) as one compiled program, `K` iterations per host call (`runner.compiled`);
        None: one step at a time with the host between the phases.
      compilation_cache: JAX's persistent compilation cache directory, so that a second run
        of the same config skips compiling (`~` expanded; `runner.compilation_cache`); None:
        off. A cache directory set in the environment (`JAX_COMPILATION_CACHE_DIR`) wins.
      shared_prompt_forward: RL on one device: the log-prob forwards and (with one minibatch
        and one micro-batch, `parallel: jit`) the update run each prompt once per layer for
        its `G` samples (`Decoder.shared_prompt_hidden_states`; the same log-probs and
        gradients up to float rounding; `runner.prompt_group_size`). Paired preference runs
        (every loss but KTO) and reward-model runs: turns on `preference.shared_prompt` /
        `reward_model.shared_prompt`, each pair's prompt once per layer for its chosen and
        rejected completions.
      reference_sync: move the reference toward the policy every few steps
        (`ReferenceSyncConfig`; None: the reference stays the initial policy).
      trim_completions: the step-by-step RL loop, SFT runs and the warm start: cut each
        batch's completions to the next power of two of its longest (at least
        `trim_minimum`, at most `sampling.max_new_tokens`) before the forwards and the update
        (`runner.completion_width`; the same losses and gradients up to float rounding, one
        compilation per width met).
      trim_minimum: the smallest width `trim_completions` cuts to.
      pack_groups: RL on one device: the forwards (policy, reference, critic) and the update
        run each step's groups packed, each prompt once and its `G` completions back to back
        in shared rows (`jaxrl_llm.train.pack_groups`; the same losses and gradients up to
        float rounding). With several minibatches or accumulation steps, micro-batches of
        whole groups (`algorithm.minibatch_unit: prompt`). Off: the padded rows.
      pack_min_saving: with `pack_groups`, pack a step only when packing removes at least
        this share of the padded forward's slots (`runner.packed_groups.packed_slot_saving`:
        `1 − (B·P + R·W) / (B·P + N·T)`, `R` the packed completion rows; 0: always; default
        0.1: a batch whose completions pack one to a row gains nothing, and one that packed
        56 rows for 64 completions (12 % saved) ran its update 1.21× and its forward 1.18×
        faster than padded).

    Examples:
      >>> build(TrainConfig, {"steps": 3, "eval_pass_k": [1, 4]}).eval_pass_k
      (1, 4)
    """

    steps: int = 100
    prompts_per_step: int = 8
    max_prompt_tokens: int | None = None
    eval_every: int = 0
    eval_prompts: int = 64
    eval_samples: int | None = None
    eval_pass_k: tuple[int, ...] = (1,)
    log_every: int = 1
    max_refills: int = 2
    overlong: OverlongConfig | None = None
    truncation_penalty: float | None = None
    max_consecutive_skips: int = 3
    compiled_iterations: int | None = None
    compilation_cache: str | None = "~/.cache/jaxrl_llm/jax"
    shared_prompt_forward: bool = True
    reference_sync: ReferenceSyncConfig | None = None
    trim_completions: bool = True
    trim_minimum: int = 16
    pack_groups: bool = False
    pack_min_saving: float = 0.1

    def __post_init__(self) -> None:
        minimum = {
            "steps": 1,
            "prompts_per_step": 1,
            "eval_every": 0,
            "eval_prompts": 0,
            "log_every": 1,
            "max_refills": 0,
            "max_consecutive_skips": 1,
            "trim_minimum": 1,
        }
        for key, low in minimum.items():
            if getattr(self, key) < low:
                raise ConfigError(f"train.{key}: must be >= {low}, got {getattr(self, key)}.")
        for key in ("max_prompt_tokens", "eval_samples", "compiled_iterations"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"train.{key}: must be >= 1 or null, got {value}.")
        if not 0.0 <= self.pack_min_saving < 1.0:
            raise ConfigError(
                f"train.pack_min_saving: must be in [0, 1), got {self.pack_min_saving}."
            )
        if not self.eval_pass_k or any(k < 1 for k in self.eval_pass_k):
            raise ConfigError(
                f"train.eval_pass_k: must be a non-empty list of ints >= 1, got "
                f"{list(self.eval_pass_k)}."
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class WarmStartConfig:
    """The `warm_start:` section: supervised fine-tuning on the task's (prompt, answer) pairs
    before RL, cached in the run directory (`warm_start/`) and reused by later runs of the same
    model, tokenizer, data, seed and warm-start settings.

    Attributes:
      steps: SFT steps.
      learning_rate: AdamW learning rate (constant, gradient clipping at 1).
      batch_size: pairs per step.
      packing: pack each step's pairs several to a row, as `sft.packing` (the same loss and
        gradient with fewer padded slots).
      packing_length: slots per packed row, at least `P + T` (None: `P + T`).

    Examples:
      >>> WarmStartConfig(steps=50).batch_size
      16
    """

    steps: int
    learning_rate: float = 1e-3
    batch_size: int = 16
    packing: bool = False
    packing_length: int | None = None

    def __post_init__(self) -> None:
        for key in ("steps", "batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"warm_start.{key}: must be >= 1, got {getattr(self, key)}.")
        if not self.learning_rate > 0:
            raise ConfigError(f"warm_start.learning_rate: must be > 0, got {self.learning_rate}.")
        if self.packing_length is not None and not self.packing:
            raise ConfigError("warm_start.packing_length: set, but warm_start.packing is off.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExportConfig:
    """The `export:` section: the final policy as a Hugging Face checkpoint (`save_pretrained`).

    Attributes:
      enabled: write it at the end of the run.
      directory: where, relative to the run directory.
      dtype: dtype of the written tensors (None: the parameters' dtype).

    Examples:
      >>> ExportConfig().directory
      'export'
    """

    enabled: bool = True
    directory: str = "export"
    dtype: DType | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One training run (see the module docstring for the cross-section rules).

    Attributes:
      model: the policy (`ModelSection`).
      tokenizer: the tokenizer (`TokenizerSection`).
      data: prompts and answers (`DataConfig`); the eval split comes from the same source.
      rewards: reward functions, combination and failure policy (`RewardConfig`).
      algorithm: the RL algorithm (`AlgorithmConfig`); exactly one of it, `sft`,
        `preference` and `reward_model`.
      sft: a supervised fine-tuning run on (prompt, answer) pairs (`SFTConfig`).
      preference: an offline preference run (`PreferenceConfig`: DPO, RPO, SimPO, CPO, ORPO,
        KTO) on preference records: `data.source` `jsonl:PATH` (`{"prompt", "chosen",
        "rejected"}`, KTO `{"prompt", "completion", "label"}`) or `arithmetic` (generated
        pairs, `jaxrl_llm.data.arithmetic_preference_records`).
      reward_model: reward-model training (`RewardModelConfig`: Bradley-Terry on the paired
        preference records of `data.source`, as for `preference`); the model is a
        `ValueModel`: `model.checkpoint` (a causal LM with a new seeded head, or a
        `*ForSequenceClassification` checkpoint) or `model.init`. The export is a
        `*ForSequenceClassification` checkpoint for `fn: reward_model`.
      preference_data: tokenization of the preference records (`PreferenceDataConfig`).
      optim: the optimizer (`OptimConfig`).
      sampling: the rollout sampler (`SamplingConfig`); the tokenizer's EOS is always a stop
        token and its pad id the filler.
      train: loop settings (`TrainConfig`).
      warm_start: optional SFT before RL (`WarmStartConfig`).
      checkpoint: `CheckpointConfig` (checkpoints in `run_dir/checkpoints`).
      metrics: `MetricsConfig` (metrics in `run_dir/metrics.jsonl`).
      mesh: `MeshConfig` (default: all devices on `data`, automatic axes).
      parallel: the compiled update step: "jit" (GSPMD over the whole mesh: data, FSDP and
        tensor parallelism; `make_update_step(mesh=)`) or "pmap" (pure data parallelism:
        replicated parameters and optimizer state, each device's rows, gradients averaged with
        an explicit `pmean`; `jaxrl_llm.train.parallel`; needs fsdp = tensor = 1). Both give
        the parameters of one device up to float rounding (docs/scaling.md).
      export: `ExportConfig`.
      seed: seeds the model initialisation, sampling and minibatch shuffling.
      run_dir: the run directory (the CLI's default: `runs/<config file name>`).

    Examples:
      >>> cfg = RunConfig(model=ModelSection(checkpoint="/models/qwen"), algorithm=AlgorithmConfig(),
      ...                 sampling=SamplingConfig(num_samples=4))
      >>> cfg.kind, cfg.group_size, cfg.rows_per_step
      ('rl', 4, 32)
      >>> RunConfig(model=ModelSection(checkpoint="/m"), algorithm=AlgorithmConfig())
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: sampling.num_samples: the 'group' estimator compares the samples of a prompt and needs num_samples >= 2, got 1.
    """

    model: ModelSection
    tokenizer: TokenizerSection = dataclasses.field(default_factory=TokenizerSection)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    rewards: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig | None = None
    sft: SFTConfig | None = None
    preference: PreferenceConfig | None = None
    reward_model: RewardModelConfig | None = None
    preference_data: PreferenceDataConfig = dataclasses.field(default_factory=PreferenceDataConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    warm_start: WarmStartConfig | None = None
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = dataclasses.field(default_factory=MetricsConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=lambda: MeshConfig(axis_types="auto"))
    parallel: Literal["jit", "pmap"] = "jit"
    export: ExportConfig = dataclasses.field(default_factory=ExportConfig)
    seed: int = 0
    run_dir: str | None = None

    def __post_init__(self) -> None:
        _validate(self)
        # the runner's pairs share their prompt by construction (`make_preference_batch`)
        pref, rm = self.preference, self.reward_model
        if self.train.shared_prompt_forward and pref is not None and pref.paired:
            object.__setattr__(self, "preference", dataclasses.replace(pref, shared_prompt=True))
        if self.train.shared_prompt_forward and rm is not None:
            object.__setattr__(self, "reward_model", dataclasses.replace(rm, shared_prompt=True))

    @property
    def trims_completions(self) -> bool:
        """Whether the step-by-step loop cuts each batch's completions to its longest
        (`train.trim_completions`, `runner.completion_width`): an RL run whose aggregations do
        not depend on the batch's width once `update_objective` fixes `norm_length`, or an
        unpacked SFT run not aggregated with `seq_mean_token_sum_norm`."""
        if not self.train.trim_completions:
            return False
        if self.sft is not None:
            return not self.sft.packing and self.sft.agg != "seq_mean_token_sum_norm"
        alg = self.algorithm
        if alg is None:
            return False
        norm = "seq_mean_token_sum_norm"
        loss = alg.policy_loss
        fixed = loss.effective_agg != norm or loss.norm_length is not None or loss.takes_norm_length
        return fixed and (alg.critic is None or alg.critic.agg != norm)

    @property
    def update_objective(self) -> Any:
        """The objective the update step optimises: `objective`, with an RL policy loss's
        `seq_mean_token_sum_norm` constant (`norm_length`, the batch's width when None) set to
        `sampling.max_new_tokens` when the loop trims completions (`trims_completions`), so
        that it stays the generation budget (Dr. GRPO) whatever the batch's width."""
        alg = self.algorithm
        if alg is None or not self.trims_completions:
            return self.objective
        loss = alg.policy_loss
        if loss.effective_agg != "seq_mean_token_sum_norm" or loss.norm_length is not None:
            return alg
        loss = dataclasses.replace(loss, norm_length=self.sampling.max_new_tokens)
        return dataclasses.replace(alg, policy_loss=loss)

    @property
    def kind(self) -> str:
        """`"rl"` (an `algorithm:` run), `"sft"`, `"preference"` or `"reward_model"`."""
        return {"algorithm": "rl"}.get(self.objective_name, self.objective_name)

    @property
    def objective_name(self) -> str:
        """The section that holds the run's objective: `"algorithm"`, `"sft"`,
        `"preference"` or `"reward_model"`."""
        return next(k for k in OBJECTIVE_SECTIONS if getattr(self, k) is not None)

    @property
    def objective(self) -> Any:
        """The run's objective config (that section's value)."""
        return getattr(self, self.objective_name)

    @property
    def uses_reference(self) -> bool:
        """Whether the run reads a reference policy: an RL algorithm with a KL term, or a
        preference loss with reference log-probs (DPO, RPO, KTO, BCO)."""
        alg, pref = self.algorithm, self.preference
        return (alg is not None and alg.needs_reference) or (
            pref is not None and pref.uses_reference
        )

    @property
    def offline_pairs(self) -> bool:
        """Whether the run trains on preference records (`preference:`, `reward_model:`)."""
        return self.kind in ("preference", "reward_model")

    @property
    def group_size(self) -> int:
        """`G`: samples per prompt in RL steps (1 for SFT and preference runs)."""
        return self.sampling.num_samples if self.kind == "rl" else 1

    @property
    def rows_per_step(self) -> int:
        """Rows of one update batch: `B·G` (RL) or `B` (SFT pairs, preference examples)."""
        return self.train.prompts_per_step * self.group_size

    @property
    def update_rows(self) -> int:
        """Rows of the update's batch: `rows_per_step`, except online DPO's `2B` (each prompt's
        pair, `train.online_dpo_select`)."""
        if self.kind == "rl" and self.algorithm.policy_loss.name == "online_dpo":
            return 2 * self.train.prompts_per_step
        return self.rows_per_step

    @property
    def update_unit(self) -> int:
        """Consecutive update rows that share a micro-batch (`train.Objective.row_unit`): 2 for
        online DPO's pairs, `G` with `algorithm.minibatch_unit: prompt`, else 1."""
        if self.kind != "rl":
            return 1
        return self.algorithm.update_unit(self.group_size)

    @property
    def eval_samples(self) -> int:
        """Samples per eval prompt at temperature 1."""
        return self.train.eval_samples or self.sampling.num_samples

    @property
    def overlong_max_length(self) -> int | None:
        """The overlong punishment's `max_length` (None when it is off)."""
        if self.train.overlong is None:
            return None
        return self.train.overlong.max_length or self.sampling.max_new_tokens


def _validate(cfg: RunConfig) -> None:
    kinds = [k for k in OBJECTIVE_SECTIONS if getattr(cfg, k) is not None]
    if len(kinds) != 1:
        raise ConfigError(
            "algorithm: set exactly one of `algorithm:` (an RL run), `sft:` (supervised "
            "fine-tuning), `preference:` (offline preference training) and `reward_model:` "
            f"(reward-model training), got {', '.join(kinds) or 'none'}."
        )
    _validate_parallel(cfg)
    if not 0 <= cfg.seed < 2**62:  # jax.random.key takes a C long; the run adds offsets
        raise ConfigError(f"seed: must lie in [0, 2**62), got {cfg.seed}.")
    if cfg.run_dir is not None and not str(cfg.run_dir).strip():  # an unset $RUN, say
        raise ConfigError("run_dir: must name a directory, got an empty path.")
    _validate_model(cfg)
    if cfg.algorithm is not None:
        _validate_algorithm(cfg, cfg.algorithm)
    _validate_batch(cfg)
    _validate_sampling_and_eval(cfg)
    _validate_rewards(cfg)
    _validate_compiled(cfg)
    _validate_pack_groups(cfg)
    _validate_reference_sync(cfg)
    if cfg.offline_pairs:
        _validate_offline_pairs(cfg)


def _validate_reference_sync(cfg: RunConfig) -> None:
    sync = cfg.train.reference_sync
    if sync is None:
        return
    if not cfg.uses_reference:
        raise ConfigError(
            "train.reference_sync: this run reads no reference policy (an RL algorithm with "
            "algorithm.kl.mode 'loss' or 'reward', online DPO, or a preference loss with "
            "reference log-probs has one); remove it."
        )
    if cfg.preference is not None and cfg.preference.precompute_reference:
        raise ConfigError(
            "train.reference_sync: the reference moves during the run, so its log-probs "
            "cannot be computed once before it (preference.precompute_reference); remove one."
        )
    adapters = cfg.model.lora is not None or cfg.model.lora_adapter is not None
    if adapters and sync.alpha != 1.0:
        raise ConfigError(
            f"train.reference_sync.alpha: {sync.alpha} with LoRA adapters would mix the "
            "adapters' A and B matrices, not the weights they make (A·B is not linear in "
            "them); use alpha 1 (the reference takes the policy's adapters) or full training."
        )


def _validate_parallel(cfg: RunConfig) -> None:
    """`parallel: pmap` is pure data parallelism with its own compiled step."""
    if cfg.parallel not in ("jit", "pmap"):
        raise ConfigError(f"parallel: must be 'jit' or 'pmap', got {cfg.parallel!r}.")
    if cfg.parallel != "pmap":
        return
    if cfg.mesh.fsdp != 1 or cfg.mesh.tensor != 1:
        raise ConfigError(
            "parallel: 'pmap' replicates the parameters over the devices (pure data "
            f"parallelism) and needs mesh.fsdp = mesh.tensor = 1, got fsdp={cfg.mesh.fsdp}, "
            f"tensor={cfg.mesh.tensor}; use parallel: jit for FSDP or tensor parallelism."
        )
    if cfg.train.compiled_iterations is not None:
        raise ConfigError(
            "parallel: 'pmap' is not available with train.compiled_iterations (the compiled "
            "RL iteration embeds the jit update step); use parallel: jit or unset "
            "train.compiled_iterations."
        )


def _validate_model(cfg: RunConfig) -> None:
    if cfg.data.template.chat and not cfg.tokenizer.chat_template:
        raise ConfigError(
            "data.template.chat: renders the prompt as chat messages, which needs "
            "tokenizer.chat_template: true."
        )
    if cfg.tokenizer.path is None and cfg.model.checkpoint is None:
        raise ConfigError(
            "tokenizer.path: null means the model checkpoint's tokenizer, but the model is "
            "`init:` (random); set tokenizer.path to 'byte' or a tokenizer directory."
        )
    init = cfg.model.init
    if init is not None and cfg.tokenizer.path == "byte" and init.vocab_size < BYTE_VOCAB:
        raise ConfigError(
            f"model.init.vocab_size: the byte tokenizer has {BYTE_VOCAB} token ids, the model "
            f"only {init.vocab_size}."
        )
    if init is not None and cfg.export.enabled:  # refused now, not after the last step
        from jaxrl_llm.models._hf_config import hf_kwargs

        try:
            hf_kwargs(init)
        except ValueError as err:
            raise ConfigError(
                f"model.init: the trained model could not be exported as a Hugging Face "
                f"checkpoint: {err} Change the model, or set export.enabled: false."
            ) from err
    critic = cfg.algorithm.critic if cfg.algorithm is not None else None
    separate = critic is not None and critic.kind == "model"
    if cfg.model.critic_checkpoint is not None and not separate:
        raise ConfigError(
            "model.critic_checkpoint: only a separate critic (algorithm.critic.kind: model) "
            "is loaded from a checkpoint."
        )
    if cfg.optim.critic_learning_rate is not None and critic is None:
        raise ConfigError(
            "optim.critic_learning_rate: is the PPO critic's learning rate, and this run has "
            "no critic (algorithm.critic); unset it."
        )
    if cfg.model.critic_lora is not None and not separate:
        raise ConfigError(
            "model.critic_lora: only a separate critic (algorithm.critic.kind: model) takes "
            "LoRA adapters; a value head trains with the policy (use model.lora)."
        )


def _validate_batch(cfg: RunConfig) -> None:
    rows = cfg.update_rows
    name = cfg.objective_name
    updates = cfg.objective.minibatches
    name = f"{name}.minibatches"
    parts = updates * cfg.optim.accumulation_steps
    if rows % (parts * cfg.update_unit):
        B = cfg.train.prompts_per_step
        what = f"{rows} rows (prompts_per_step {B} × {cfg.group_size} samples)"
        if cfg.update_unit > 1:  # whole pairs or prompts
            what = (
                f"{B} pairs of rows (online DPO: one per prompt)"
                if cfg.algorithm.policy_loss.name == "online_dpo"
                else f"{B} prompts of {cfg.group_size} rows (algorithm.minibatch_unit: prompt)"
            )
        raise ConfigError(
            f"train.prompts_per_step: a step's update has {what}, not divisible into "
            f"{name} × optim.accumulation_steps = {updates} × {cfg.optim.accumulation_steps} "
            "equal micro-batches."
        )
    sizes = (cfg.mesh.data, cfg.mesh.fsdp)
    if -1 not in sizes:
        _check_batch_axes(cfg, sizes[0] * sizes[1])
        _check_rows_per_device(cfg, sizes[0] * sizes[1])
    if cfg.warm_start is not None and cfg.kind != "rl":
        raise ConfigError(f"warm_start: is SFT before RL, not before a {cfg.kind} run.")


def _check_batch_axes(cfg: RunConfig, batch_devices: int) -> None:
    """The prompts of a step (and so its rows) split evenly over the mesh's data × fsdp axes."""
    if cfg.train.prompts_per_step % batch_devices:
        raise ConfigError(
            f"train.prompts_per_step: {cfg.train.prompts_per_step} prompts do not split evenly "
            f"over the mesh's data × fsdp = {batch_devices} devices."
        )
    if cfg.warm_start is not None and cfg.warm_start.batch_size % batch_devices:
        raise ConfigError(
            f"warm_start.batch_size: {cfg.warm_start.batch_size} pairs do not split evenly over "
            f"the mesh's data × fsdp = {batch_devices} devices."
        )


def _check_rows_per_device(cfg: RunConfig, devices: int) -> None:
    """`parallel: pmap`: each device splits its own rows into the step's micro-batches."""
    if cfg.parallel != "pmap":
        return
    name, section = cfg.objective_name, cfg.objective
    parts = section.minibatches * cfg.optim.accumulation_steps
    per_device = cfg.update_rows // devices
    if per_device % (parts * cfg.update_unit):
        raise ConfigError(
            f"train.prompts_per_step: with parallel: pmap each of the {devices} devices gets "
            f"{per_device} of the step's {cfg.update_rows} rows"
            + (f" (whole units of {cfg.update_unit} rows)" if cfg.update_unit > 1 else "")
            + ", not divisible into "
            f"{name}.minibatches × optim.accumulation_steps = {section.minibatches} × "
            f"{cfg.optim.accumulation_steps} micro-batches."
        )


def check_devices(cfg: RunConfig, device_count: int) -> tuple[int, int, int]:
    """Resolve the mesh on `device_count` devices and check that the batches split over it.

    Called when the run starts (the `-1` axis size is only known then), before compiling.

    Examples:
      >>> cfg = RunConfig(model=ModelSection(checkpoint="/m"), sft=SFTConfig(),
      ...                 train=TrainConfig(prompts_per_step=6))
      >>> check_devices(cfg, 1)
      (1, 1, 1)
      >>> check_devices(cfg, 4)
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: train.prompts_per_step: 6 prompts do not split evenly over the mesh's data × fsdp = 4 devices.
    """
    try:
        data, fsdp, tensor = cfg.mesh.resolve(device_count)
    except ValueError as err:
        raise ConfigError(f"mesh: {err}") from None
    _check_batch_axes(cfg, data * fsdp)
    _check_rows_per_device(cfg, data * fsdp)
    return data, fsdp, tensor


def _validate_sampling_and_eval(cfg: RunConfig) -> None:
    groups, B = cfg.sampling.row_groups, cfg.train.prompts_per_step
    if groups is not None and B % groups:
        raise ConfigError(
            f"sampling.row_groups: {groups} groups must divide train.prompts_per_step ({B}), the "
            "prompts of each sampling call; use a divisor of it or null (automatic)."
        )
    bad_k = [k for k in cfg.train.eval_pass_k if k > cfg.eval_samples]
    if bad_k:
        raise ConfigError(
            f"train.eval_pass_k: pass@k needs k <= the eval samples per prompt "
            f"({cfg.eval_samples}, train.eval_samples or sampling.num_samples), got {bad_k}."
        )
    penalty = cfg.train.truncation_penalty
    if penalty is not None:
        if cfg.kind != "rl":
            raise ConfigError("train.truncation_penalty: it shapes RL rewards only.")
        if not penalty <= 1.0:
            raise ConfigError(
                f"train.truncation_penalty: must be <= 1 (in [0, 1] it scales a truncated "
                f"completion's reward, below 0 it replaces it), got {penalty}."
            )
        if cfg.rewards.combine == "decoupled":
            raise ConfigError(
                "train.truncation_penalty: applies to the total reward, which rewards.combine: "
                "decoupled does not form; use combine: sum."
            )
    overlong = cfg.train.overlong
    if overlong is not None:
        if cfg.kind != "rl":
            raise ConfigError("train.overlong: the overlong punishment shapes RL rewards only.")
        max_length = cfg.overlong_max_length
        if overlong.buffer_length > max_length:
            raise ConfigError(
                f"train.overlong.buffer_length: must be <= max_length ({max_length}), got "
                f"{overlong.buffer_length}."
            )
        start = max_length - overlong.buffer_length
        if start >= cfg.sampling.max_new_tokens:
            raise ConfigError(
                f"train.overlong: the penalty starts after max_length − buffer_length = {start} "
                f"tokens, and no completion is longer than sampling.max_new_tokens = "
                f"{cfg.sampling.max_new_tokens}: it would never apply; lower max_length or raise "
                "buffer_length."
            )


def _validate_algorithm(cfg: RunConfig, alg: AlgorithmConfig) -> None:
    G = cfg.sampling.num_samples
    estimator = alg.advantage.estimator
    if estimator in GROUPED_ESTIMATORS and G < 2:
        raise ConfigError(
            f"sampling.num_samples: the {estimator!r} estimator compares the samples of a prompt "
            f"and needs num_samples >= 2, got {G}."
        )
    if cfg.sampling.greedy:
        raise ConfigError(
            "sampling.temperature: RL samples from the policy; temperature 0 (greedy) gives no "
            "exploration and no valid behaviour log-probs."
        )
    if alg.temperature != cfg.sampling.temperature:
        raise ConfigError(
            f"algorithm.temperature: the update scores the sampler's policy, so it must equal "
            f"sampling.temperature ({cfg.sampling.temperature}), got {alg.temperature}."
        )
    sampling = cfg.sampling
    filtered = (sampling.top_k, sampling.top_p, sampling.min_p) != (None, None, None)
    if (
        alg.rollout_correction is not None
        and alg.needs_old_logprobs
        and alg.old_logprobs == "sampler"
        and not filtered
    ):
        raise ConfigError(
            "algorithm.rollout_correction: with old_logprobs 'sampler' the old log-probs are "
            "the sampler's own, equal to the rollout log-probs when no top_k / top_p / min_p "
            "filter is on, so every weight would be 1; use old_logprobs 'forward' (the "
            "trainer's forward, which the correction compares with the sampler) or drop the "
            "correction."
        )


def _validate_rewards(cfg: RunConfig) -> None:
    rewards = cfg.rewards
    kind, _ = parse_source(cfg.data.source)
    if rewards.jax_native and kind not in BUILTIN_TASKS:
        raise ConfigError(
            f"rewards.jax_native: the in-graph reward is for the built-in tasks "
            f"({', '.join(BUILTIN_TASKS)}), got data.source {cfg.data.source!r}."
        )
    if rewards.jax_native and cfg.sampling.stop_strings:
        raise ConfigError(
            "rewards.jax_native: the in-graph exact-answer reward compares the completion's "
            "tokens before its first stop token with the answer's, and the tokens that complete "
            "a stop string are part of the completion, so a right answer that stopped on one of "
            f"sampling.stop_strings {list(cfg.sampling.stop_strings)} would score 0; use "
            "sampling.stop_tokens, or rewards.jax_native: false (the host reward reads the "
            "decoded text)."
        )
    if rewards.jax_native and cfg.tokenizer.path != "byte":
        log.warning(
            "rewards.jax_native: the in-graph reward compares the answer's tokens as the "
            "tokenizer %s writes them; with a subword tokenizer a right answer written in other "
            'tokens ("19" as "1", "9") scores 0 where the host reward scores 1 '
            "(docs/rewards_and_data.md); rewards.jax_native: false reads the decoded text",
            "of the model checkpoint" if cfg.tokenizer.path is None else repr(cfg.tokenizer.path),
        )
    alg = cfg.algorithm
    if alg is None:
        return
    decoupled_ok = alg.advantage.estimator == "group" and alg.kl.mode != "reward"
    if rewards.combine == "decoupled" and not decoupled_ok:
        raise ConfigError(
            "rewards.combine: 'decoupled' (GDPO) normalises each reward within its group "
            "and replaces the group estimator's normalisation; it needs "
            "algorithm.advantage.estimator 'group' and no KL in the reward, got "
            f"estimator {alg.advantage.estimator!r}, kl.mode {alg.kl.mode!r}."
        )
    if rewards.on_failure == "drop_group" and alg.advantage.scale == "batch":
        raise ConfigError(
            "rewards.on_failure: 'drop_group' keeps the dropped groups' filler rewards in the "
            "batch, and advantage.scale 'batch' would put them into the batch std; use "
            "on_failure 'score' or advantage.scale 'group'."
        )


def _validate_compiled(cfg: RunConfig) -> None:
    """`train.compiled_iterations` needs an iteration with no host step (`runner.compiled`)."""
    K = cfg.train.compiled_iterations
    if K is None:
        return
    key = "train.compiled_iterations"
    if cfg.kind != "rl":
        raise ConfigError(f"{key}: compiles the RL iteration; a {cfg.kind} run has none.")
    if not cfg.rewards.jax_native:
        raise ConfigError(
            f"{key}: needs rewards.jax_native: true; reward functions on decoded text run on "
            "the host between sampling and the update."
        )
    if cfg.algorithm.advantage.drop_zero_variance and cfg.train.max_refills > 0:
        raise ConfigError(
            f"{key}: DAPO's refills re-sample on the host until enough groups have a reward "
            "spread; set train.max_refills: 0 (the in-graph zero-variance filter only)."
        )
    evaluates = cfg.train.eval_prompts > 0  # eval_every means nothing with evaluation off
    for name, every in (
        ("train.eval_every", cfg.train.eval_every if evaluates else 0),
        ("checkpoint.every", cfg.checkpoint.every),
    ):
        if every % K:
            raise ConfigError(
                f"{name}: must be a multiple of {key} = {K} (it acts between compiled chunks), "
                f"got {every}."
            )


def _validate_pack_groups(cfg: RunConfig) -> None:
    """`train.pack_groups` packs whole groups into each of the update's micro-batches, in the
    step-by-step loop (`jaxrl_llm.train.group_packing`)."""
    if not cfg.train.pack_groups:
        return
    key = "train.pack_groups"
    if cfg.kind != "rl":
        raise ConfigError(f"{key}: packs RL rollout groups; a {cfg.kind} run has none.")
    alg = cfg.algorithm
    reasons = [
        (cfg.train.compiled_iterations is not None, "the compiled iteration keeps fixed shapes"),
        (cfg.parallel != "jit", "parallel: pmap splits the rows over devices"),
    ]
    for refused, why in reasons:
        if refused:
            raise ConfigError(f"{key}: not with this run: {why}; set it to false.")
    parts = alg.minibatches * cfg.optim.accumulation_steps
    group = 2 if keeps_row_subset(alg, cfg.group_size) else cfg.group_size  # packed groups
    if parts > 1 and cfg.update_unit % group:
        raise ConfigError(
            f"{key}: the update's {parts} micro-batches (minibatches × accumulation_steps) "
            "take strided rows, so each would hold part of every group; set "
            "algorithm.minibatch_unit: prompt (micro-batches of whole groups) or pack_groups: "
            "false."
        )


def _validate_offline_pairs(cfg: RunConfig) -> None:
    kind, _ = parse_source(cfg.data.source)
    if kind not in ("arithmetic", "jsonl"):
        raise ConfigError(
            f"data.source: {cfg.kind} runs read preference records from 'jsonl:PATH' or "
            f"generate them from 'arithmetic', got {cfg.data.source!r}."
        )
    pref = cfg.preference
    if pref is not None and pref.needs_reference_point and cfg.train.prompts_per_step < 2:
        raise ConfigError(
            "train.prompts_per_step: KTO's reference point needs mismatched pairs within a "
            f"batch, at least 2 examples, got {cfg.train.prompts_per_step}."
        )


def config_to_dict(config: Any) -> Any:
    """A config as plain JSON data: dataclasses → dicts, tuples → lists.

    Examples:
      >>> config_to_dict(TrainConfig(steps=2))["eval_pass_k"]
      [1]
    """
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: config_to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, list | tuple):
        return [config_to_dict(v) for v in config]
    if isinstance(config, dict):
        return {str(k): config_to_dict(v) for k, v in config.items()}
    return config


def config_hash(data: Any) -> str:
    """A short stable hash of a config (or of part of one), from its JSON form.

    Examples:
      >>> config_hash(TrainConfig()) == config_hash(TrainConfig()), len(config_hash({"a": 1}))
      (True, 16)
    """
    text = json.dumps(config_to_dict(data), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
