"""A learned reward model as a reward function (RLHF): `fn: reward_model` in `rewards.functions`.

    rewards:
      functions:
        - fn: reward_model
          kwargs: {checkpoint: /models/my-rm, tokenizer: /models/my-rm}
        - {fn: tag_format, weight: 0.2}

The checkpoint is a Hugging Face `*ForSequenceClassification` directory with one label (a
Bradley-Terry reward model, as TRL's `RewardTrainer` and OpenRLHF write them; the families of
`jaxrl_llm.models`), loaded once as a frozen `ValueModel`. The reward of a completion is the
model's score at the last token of `prompt + completion` + EOS, tokenized with the reward
model's own tokenizer (so it may differ from the policy's), as `*ForSequenceClassification`
scores the last non-padding token:

    r = score · h_last(tokens(prompt + completion) + [EOS])     (the `score.weight` head)

The EOS matches how reward models are trained on preference data (`train_reward_model`, TRL);
`add_eos: false` scores the text as it is.

Rows are scored in batches of `batch_size`, right-padded to a power-of-two length (at least
16; one compiled program per length); a text longer than `max_length` tokens keeps its last
`max_length` (the completion's end, where the score is read). The model runs on a mesh of this
process's devices (`mesh`, by default every local device on the `fsdp` axis): its weights are
placed by the logical-axis rules, as the policy's are, and each batch's rows are split over the
mesh's batch axes (`data`, `fsdp`), so a reward model larger than one device's memory fits and
every device scores its share of the rows. The mesh holds local devices only, so the scoring
needs no other process. `dtype: bfloat16` stores and runs the model in bfloat16 (the scores
are returned as float32). As a host reward function it takes part in everything the others
do: weights, the decoupled combination, the failure policy and timeout, and, in a multi-host
job, each process scores its share of the groups. The first call of each padded length
compiles the forward within the reward's time limit (`rewards.timeout_s`): give a large model
one that covers it.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sharding import MeshConfig, batch_shardings, make_mesh

_MIN_LENGTH = 16
_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def _bucket(length: int) -> int:
    """The padded length of a batch whose longest text has `length` tokens: a power of two.

    Examples:
      >>> [_bucket(n) for n in (1, 16, 17, 100)]
      [16, 16, 32, 128]
    """
    return max(_MIN_LENGTH, 1 << (max(length, 1) - 1).bit_length())


def _local_mesh(fields: dict[str, Any] | None) -> jax.sharding.Mesh:
    """The `(data, fsdp, tensor)` mesh of this process's devices described by `fields`."""
    fields = {"data": 1, "fsdp": -1} if fields is None else fields
    if not isinstance(fields, dict):
        raise ValueError(
            f"reward_model: `mesh` must be a mapping of MeshConfig fields, got {fields!r}."
        )
    try:
        return make_mesh(MeshConfig(**fields), devices=jax.local_devices())
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"reward_model: `mesh` {fields} does not fit this process's "
            f"{jax.local_device_count()} devices: {err}"
        ) from err


def reward_model(
    *,
    checkpoint: str,
    tokenizer: str | None = None,
    batch_size: int = 16,
    max_length: int = 2048,
    add_eos: bool = True,
    dtype: str = "float32",
    mesh: dict[str, Any] | None = None,
) -> Any:
    """Load a reward model and return the reward function that scores with it (module
    docstring). Called once, when the run's reward functions are resolved.

    Args:
      checkpoint: a local `*ForSequenceClassification` checkpoint directory with one label.
      tokenizer: the reward model's tokenizer: a directory, or `"byte"` (default: the
        checkpoint directory).
      batch_size: rows per forward, rounded up to a multiple of the number of devices the rows
        split over (the mesh's `data` × `fsdp`).
      max_length: tokens kept per text (the last ones).
      add_eos: end every text with the tokenizer's EOS before scoring, as the preference
        data a reward model is trained on ends every completion (`train_reward_model`,
        `PreferenceDataConfig.add_eos`); the sampler's completions come without it.
      dtype: `"float32"` or `"bfloat16"`: the dtype the weights are stored and computed in.
      mesh: the `MeshConfig` fields (`data`, `fsdp`, `tensor`, `axis_types`) of the mesh of
        this process's devices that the model runs on (default `{"data": 1, "fsdp": -1}`:
        weights and rows split over every local device). `{"data": -1}` replicates the weights
        and splits only the rows (faster where the model fits on one device).

    Returns:
      `fn(prompts, completions, **fields) -> list[float]`; `fn.state` is the loaded model's
      `nnx.State`, placed on `fn.mesh`.

    Raises:
      ValueError: the checkpoint is missing, is not a one-label sequence classifier (no
        `score.weight`), an option is out of range, or the mesh does not fit the local devices.

    Examples:
      >>> import tempfile
      >>> from jaxrl_llm.models import ModelConfig, ValueModel, save_pretrained
      >>> cfg = ModelConfig(family="qwen3", vocab_size=259, hidden_size=8, intermediate_size=16,
      ...                   num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> path = tempfile.mkdtemp()
      >>> save_pretrained(ValueModel(cfg, rngs=nnx.Rngs(0)), path)
      >>> score = reward_model(checkpoint=path, tokenizer="byte")
      >>> rewards = score(["1+1="] * 2, ["2", "3"])
      >>> len(rewards), rewards[0] != rewards[1]
      (2, True)
    """
    from jaxrl_llm.models import ValueModel, from_pretrained
    from jaxrl_llm.models.hf_io import open_checkpoint
    from jaxrl_llm.tokenizer import load_tokenizer
    from jaxrl_llm.train import SequenceBatch, sequence_scores
    from jaxrl_llm.train.shardings import batch_devices

    for name, value in (("batch_size", batch_size), ("max_length", max_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"reward_model: `{name}` must be an int >= 1, got {value!r}.")
    if dtype not in _DTYPES:
        raise ValueError(f"reward_model: `dtype` must be one of {sorted(_DTYPES)}, got {dtype!r}.")
    device_mesh = _local_mesh(mesh)
    path = pathlib.Path(checkpoint)
    if not (path / "config.json").is_file():
        raise ValueError(f"reward_model: {path} is not a checkpoint directory (no config.json).")
    with open_checkpoint(path) as handles:
        if "score.weight" not in handles:
            raise ValueError(
                f"reward_model: {path} has no `score.weight`: not a *ForSequenceClassification "
                "reward model (a causal LM checkpoint cannot score completions)."
            )
    model = from_pretrained(
        path, head="value", mesh=device_mesh, dtype=_DTYPES[dtype], param_dtype=_DTYPES[dtype]
    )
    assert isinstance(model, ValueModel)
    try:
        tok = load_tokenizer(path if tokenizer is None else tokenizer)
    except ValueError as err:  # the reward model's own option, not the run's tokenizer.path
        raise ValueError(
            f"reward_model: {err} For a reward model, set its `tokenizer` option "
            "(kwargs: {tokenizer: byte}, say)."
        ) from None
    if add_eos and tok.eos_id is None:
        raise ValueError("reward_model: the tokenizer has no EOS token; set add_eos: false.")
    graphdef, state = nnx.split(model)
    split = batch_devices(device_mesh)  # what `batch_shardings` splits the rows over
    batch_size = -(-batch_size // split) * split

    @jax.jit
    def last_token_scores(state: Any, tokens: jax.Array, lengths: jax.Array) -> jax.Array:
        mask = (jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]).astype(jnp.int32)
        return sequence_scores(nnx.merge(graphdef, state), SequenceBatch(tokens, mask, mask))

    def score(prompts: Sequence[str], completions: Sequence[str], **fields: Any) -> list[float]:
        del fields
        eos = [tok.eos_id] if add_eos else []
        texts = [p + c for p, c in zip(prompts, completions, strict=True)]
        ids = [(tok.encode(text) + eos)[-max_length:] for text in texts]
        ids = [row or [tok.pad_id] for row in ids]  # an empty text: scored at one pad token
        out: list[float] = []
        for first in range(0, len(ids), batch_size):
            rows = ids[first : first + batch_size]
            tokens = np.full((batch_size, _bucket(max(map(len, rows)))), tok.pad_id, np.int32)
            lengths = np.ones(batch_size, np.int32)  # filler rows: one pad token, ignored
            for i, row in enumerate(rows):
                tokens[i, : len(row)], lengths[i] = row, len(row)
            batch = jax.device_put(
                (tokens, lengths), batch_shardings((tokens, lengths), device_mesh)
            )
            with jax.set_mesh(device_mesh):
                scores = last_token_scores(state, *batch)
            out.extend(float(s) for s in np.asarray(scores)[: len(rows)])
        return out

    score.state, score.mesh = state, device_mesh  # type: ignore[attr-defined]
    return score
