"""The run's tokenizer and models: the policy (a checkpoint or a random init), the PPO critic.

    policy   model.checkpoint → from_pretrained(dtype, param_dtype, remat, attention_chunk,
                                              fused_attention)
             model.init       → Decoder(init, rngs=Rngs(seed))
             (a `reward_model:` run trains a ValueModel in the policy's place:
              from_pretrained(..., head="value", seed=seed), or ValueModel(init, rngs=Rngs(seed)))
             model.lora       → add_lora(policy, lora, rngs=Rngs(seed + 2)) on either
             model.lora_adapter → load_lora_adapter(policy, path) (a PEFT adapter directory)
    critic   algorithm.critic.kind = "head"  → ValueHead(D, rngs=Rngs(seed + 1))
             algorithm.critic.kind = "model" → from_pretrained(model.critic_checkpoint or
                                               model.checkpoint, head="value"), or a random
                                               ValueModel(init, rngs=Rngs(seed + 1))
             model.critic_lora → add_lora(critic, critic_lora, rngs=Rngs(seed + 3))

Everything is deterministic in the config, so a resumed run rebuilds exactly the same initial
models (the reference policy is the initial policy, after the warm start). Random
initialisations run as one compiled program (`compiled_init`), with the values of the eager
construction.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_llm.config import ConfigError
from jaxrl_llm.models import (
    Decoder,
    ValueHead,
    ValueModel,
    add_lora,
    copy_side_files,
    from_pretrained,
    has_lora,
    save_pretrained,
)
from jaxrl_llm.models.lora_io import load_lora_adapter, save_lora_adapter
from jaxrl_llm.runner.config import RunConfig
from jaxrl_llm.tokenizer import HFTokenizer, load_tokenizer
from jaxrl_llm.train import ModelGraphs
from sharding import fetch_global, is_main_process

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
ADAPTER_DIR = "adapter"  # the export's LoRA adapters in PEFT's format

log = logging.getLogger(__name__)


_INIT_PROGRAMS: dict[Hashable, tuple[Callable[..., nnx.State], list]] = {}  # per process


def compiled_init(
    factory: Callable[..., nnx.Module], *, seed: int | None = None, key: Hashable = None
) -> nnx.Module:
    """`factory()`, its variables computed by one compiled program instead of op by op.

    Built eagerly, a module compiles every initialisation op on first use (about 25 small
    programs for a decoder: ≈ 1.1 s on the small benchmark model against 0.8 s for one
    program, on a 2-core CPU). The values are the same: the normal draws are bit-identical
    under `jit` (`models.layers._scaled_normal`), zeros and ones are exact.

    With `seed`, `factory(rngs)` receives `nnx.Rngs(seed)` (the same draws as `nnx.Rngs(seed)`
    built inside it), the seed entering the program as an argument; with a hashable `key` as
    well, the compiled program is kept for the process under `key`, and a later call with the
    same `key` (any seed) runs it without tracing or compiling again (a second run of one
    architecture in a notebook, the suite's many tiny runs). `key` must determine everything
    `factory` builds apart from the seed.

    Examples:
      >>> m = compiled_init(lambda: ValueHead(4, rngs=nnx.Rngs(0)))
      >>> e = ValueHead(4, rngs=nnx.Rngs(0))
      >>> bool(jnp.array_equal(nnx.state(m)["kernel"][...], nnx.state(e)["kernel"][...]))
      True
      >>> k = compiled_init(lambda rngs: ValueHead(4, rngs=rngs), seed=0, key=("head", 4))
      >>> bool(jnp.array_equal(nnx.state(k)["kernel"][...], nnx.state(e)["kernel"][...]))
      True
    """
    if seed is None:
        if key is not None:
            raise ValueError("compiled_init: `key` caches a program of the seed; pass `seed` too.")
        graphdefs: list = []  # filled while tracing: the graph is static, only the state computed

        def init() -> nnx.State:
            graphdef, state = nnx.split(factory())
            graphdefs.append(graphdef)
            return state

        state = jax.jit(init)()
        return nnx.merge(graphdefs[-1], state)
    program = _INIT_PROGRAMS.get(key) if key is not None else None
    if program is None:
        graphdefs = []

        def init_from_key(rng_key: jax.Array) -> nnx.State:
            graphdef, state = nnx.split(factory(nnx.Rngs(rng_key)))
            graphdefs.append(graphdef)
            return state

        program = (jax.jit(init_from_key), graphdefs)
        if key is not None:
            _INIT_PROGRAMS[key] = program
    init_fn, graphdefs = program
    state = init_fn(jax.random.key(seed))
    return nnx.merge(graphdefs[-1], state)


def _program_key(cls: type, shape: Any, kwargs: dict[str, Any]) -> Hashable:
    """`compiled_init`'s cache key for `cls(shape, **kwargs)`, or None (not cached) when a
    setting is not hashable."""
    key = (cls, shape, tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def run_tokenizer(config: RunConfig) -> Any:
    """The tokenizer of `config.tokenizer` (None: the model checkpoint's directory).

    Examples:
      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.train import SFTConfig
      >>> run_tokenizer(RunConfig(model=ModelSection(checkpoint="/m"), sft=SFTConfig())).eos_id
      258
    """
    path = config.tokenizer.path if config.tokenizer.path is not None else config.model.checkpoint
    if config.tokenizer.path is None and not pathlib.Path(path).is_dir():
        raise ConfigError(
            f"model.checkpoint: {path} is not a directory (tokenizer.path: null reads the "
            "tokenizer from it too)."
        )
    try:
        return load_tokenizer(path, chat_template=config.tokenizer.chat_template)
    except (ValueError, OSError) as err:
        raise ConfigError(f"tokenizer.path: {err}") from None


def build_policy(config: RunConfig) -> Decoder | ValueModel:
    """The initial policy (before any warm start); the `ValueModel` of a `reward_model:` run.

    Examples:
      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.models import ModelConfig
      >>> from jaxrl_llm.train import SFTConfig
      >>> init = ModelConfig(family="qwen3", vocab_size=259, hidden_size=8,
      ...     intermediate_size=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> build_policy(RunConfig(model=ModelSection(init=init), sft=SFTConfig())).config.hidden_size
      8
    """
    section = config.model
    kwargs = {
        "dtype": DTYPES[section.dtype],
        "param_dtype": DTYPES[section.param_dtype],
        "remat": section.remat,
        "attention_chunk": section.attention_chunk,
        "fused_attention": section.fused_attention,
    }
    scorer = config.kind == "reward_model"
    if section.checkpoint is not None:
        loaded = {"head": "value", "seed": config.seed} if scorer else {}
        try:
            model = from_pretrained(section.checkpoint, **kwargs, **loaded)
        except (ValueError, OSError) as err:
            raise ConfigError(f"model.checkpoint: {err}") from None
    else:
        cls = ValueModel if scorer else Decoder
        model = compiled_init(
            lambda rngs: cls(section.init, **kwargs, rngs=rngs),
            seed=config.seed,
            key=_program_key(cls, section.init, kwargs),
        )
    if section.lora is not None:
        model = add_lora(model, section.lora, rngs=nnx.Rngs(config.seed + 2))
    elif section.lora_adapter is not None:
        try:
            model = load_lora_adapter(model, section.lora_adapter)
        except (ValueError, OSError) as err:
            raise ConfigError(f"model.lora_adapter: {err}") from None
    return model


def build_critic(config: RunConfig, policy: Decoder) -> nnx.Module | None:
    """The critic of a PPO-style algorithm (None without one); see the module docstring.

    Examples:
      >>> from jaxrl_llm.runner.config import ModelSection
      >>> from jaxrl_llm.train import SFTConfig
      >>> build_critic(RunConfig(model=ModelSection(checkpoint="/m"), sft=SFTConfig()), None) is None
      True
    """
    critic = config.algorithm.critic if config.algorithm is not None else None
    if critic is None:
        return None
    section = config.model
    param_dtype = DTYPES[section.param_dtype]
    if critic.kind == "head":
        hidden = policy.config.hidden_size
        return compiled_init(
            lambda rngs: ValueHead(hidden, param_dtype=param_dtype, rngs=rngs),
            seed=config.seed + 1,
            key=_program_key(ValueHead, hidden, {"param_dtype": param_dtype}),
        )
    kwargs = {
        "dtype": DTYPES[section.dtype],
        "param_dtype": param_dtype,
        "remat": section.remat,
        "attention_chunk": section.attention_chunk,
        "fused_attention": section.fused_attention,
    }
    path = section.critic_checkpoint or section.checkpoint
    if path is None:
        model = compiled_init(
            lambda rngs: ValueModel(section.init, **kwargs, rngs=rngs),
            seed=config.seed + 1,
            key=_program_key(ValueModel, section.init, kwargs),
        )
    else:
        key = "model.critic_checkpoint" if section.critic_checkpoint else "model.checkpoint"
        try:
            model = from_pretrained(path, **kwargs, head="value", seed=config.seed + 1)
        except (ValueError, OSError) as err:
            raise ConfigError(f"{key}: {err}") from None
    if section.critic_lora is not None:
        model = add_lora(model, section.critic_lora, rngs=nnx.Rngs(config.seed + 3))
    return model


def check_vocabulary(tokenizer: Any, policy: Decoder) -> None:
    """Every token id of the tokenizer must have an embedding.

    Examples:
      >>> from types import SimpleNamespace
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> policy = SimpleNamespace(config=SimpleNamespace(vocab_size=100))  # a Decoder's config
      >>> check_vocabulary(ByteTokenizer(), policy)
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: tokenizer.path: the tokenizer has 259 token ids, the model's vocabulary only 100.
    """
    if tokenizer.vocab_size > policy.config.vocab_size:
        raise ConfigError(
            f"tokenizer.path: the tokenizer has {tokenizer.vocab_size} token ids, the model's "
            f"vocabulary only {policy.config.vocab_size}."
        )


def check_context(
    prompt_length: int,
    completion_length: int,
    policy: Decoder,
    *,
    names: tuple[str, str] = ("the prompt budget", "sampling.max_new_tokens"),
) -> bool:
    """Warn when a prompt budget `P` plus the completion budget `T` exceeds the model's context
    (`max_position_embeddings`): the rotary positions run on past it, but a pretrained model
    was not trained there. Returns whether it fits (as `generate` warns, once per run here).
    `names` are the two budgets' names in the warning (a preference run's are
    `preference_data.max_prompt_length` and `max_completion_length`).

    Examples:
      >>> from types import SimpleNamespace
      >>> policy = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=32))
      >>> check_context(24, 8, policy), check_context(24, 9, policy)
      (True, False)
    """
    context = policy.config.max_position_embeddings
    if context is None or prompt_length + completion_length <= context:
        return True
    log.warning(
        "%s (%d tokens) plus %s (%d) is over the model's context of %d positions "
        "(max_position_embeddings): positions past it are outside what the model was trained on",
        names[0],
        prompt_length,
        names[1],
        completion_length,
        context,
    )
    return False


def export_policy(
    graphs: ModelGraphs,
    params: Any,
    frozen: Any,
    path: str | pathlib.Path,
    dtype: str | None,
    tokenizer: Any = None,
    base_model: str | None = None,
) -> pathlib.Path:
    """Write the policy `merge(graphs.policy, params, frozen)` as a Hugging Face checkpoint
    (a `ValueModel`: a `*ForSequenceClassification` one, its `pad_token_id` the tokenizer's
    when the model's config has none), with the run's tokenizer files when
    it is a `transformers` tokenizer, so that the directory is a complete `model.checkpoint`
    (tokenizer included) for the next stage; the byte tokenizer has no files (the next stage
    sets `tokenizer.path: byte`). A policy with LoRA adapters is written merged, and its
    adapters alone in PEFT's format in `path/adapter` (`base_model` recorded as the checkpoint
    they apply to). A policy exported from a `base_model` checkpoint keeps its
    `generation_config.json` (the EOS ids and sampling defaults `transformers` and vLLM use).

    Every process of a multi-process job calls it (sharded parameters are gathered); process 0
    writes.

    Examples:
      >>> import tempfile
      >>> from jaxrl_llm.models import ModelConfig
      >>> from jaxrl_llm.train import split_models
      >>> cfg = ModelConfig(family="qwen3", vocab_size=259, hidden_size=8, intermediate_size=16,
      ...                   num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> graphs, params, frozen = split_models(Decoder(cfg, rngs=nnx.Rngs(0)))
      >>> out = export_policy(graphs, params["policy"], frozen["policy"], tempfile.mkdtemp(), None)
      >>> sorted(p.name for p in out.iterdir())
      ['config.json', 'model.safetensors']
    """
    params, frozen = fetch_global((params, frozen))  # every process: a collective when sharded
    path = pathlib.Path(path)
    if not is_main_process():  # one writer per job
        return path
    policy = nnx.merge(graphs.policy, params, frozen)
    pad = getattr(tokenizer, "pad_id", None)
    if isinstance(policy, ValueModel) and policy.config.pad_token_id is None and pad is not None:
        # transformers' *ForSequenceClassification finds each row's last token by the pad id
        # and refuses batches of more than one without it (TRL's reward trainer sets it too)
        policy.config = dataclasses.replace(policy.config, pad_token_id=int(pad))
    save_pretrained(policy, path, dtype=None if dtype is None else DTYPES[dtype])
    if isinstance(tokenizer, HFTokenizer):
        tokenizer.tokenizer.save_pretrained(str(path))
    if isinstance(policy, Decoder) and base_model is not None and pathlib.Path(base_model).is_dir():
        copy_side_files(base_model, path, tokenizer=False)  # its EOS ids and sampling defaults
    if isinstance(policy, Decoder) and has_lora(policy):
        save_lora_adapter(policy, path / ADAPTER_DIR, base_model=base_model)
    return path
