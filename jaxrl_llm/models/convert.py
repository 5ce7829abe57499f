"""`jaxrl-llm convert`: check a local Hugging Face checkpoint and optionally re-export it.

Checking loads the checkpoint with every validation of `from_pretrained` (config, headers,
tensor names, shapes), runs one forward pass on a few tokens and requires finite logits.
Re-exporting writes it back with `save_pretrained`, e.g. in another dtype or shard size, with
the source's `generation_config.json` and tokenizer files, so that the copy is complete.
"""

from __future__ import annotations

import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.models.hf_io import copy_side_files, from_pretrained, save_pretrained

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def check_checkpoint(
    path: str | pathlib.Path,
    *,
    dtype: str = "float32",
    out: str | pathlib.Path | None = None,
    max_shard_bytes: int = 4 * 1024**3,
) -> dict[str, Any]:
    """Load, smoke-test and optionally re-save a checkpoint; returns a summary.

    Args:
      path: checkpoint directory.
      dtype: parameter and compute dtype while checking, and the dtype written to `out`.
      out: directory to write the checkpoint to (None: only check), with the source's
        generation config and tokenizer files.
      max_shard_bytes: shard size of the written checkpoint.

    Returns:
      `{"family", "layers", "parameters", "dtype", "max_abs_logit", "written"}`.

    Raises:
      ValueError: from `from_pretrained` (the message names the problem), an unknown `dtype`,
        or non-finite logits.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}.")
    model = from_pretrained(path, dtype=DTYPES[dtype], param_dtype=DTYPES[dtype])
    config = model.config
    tokens = jnp.arange(8, dtype=jnp.int32)[None] % config.vocab_size
    logits = model(tokens, jnp.arange(8, dtype=jnp.int32)[None])
    if not bool(jnp.isfinite(logits).all()):
        raise ValueError(f"{path}: the forward pass produced non-finite logits.")
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    if out is not None:
        save_pretrained(model, out, max_shard_bytes=max_shard_bytes)
        copy_side_files(path, out)
    return {
        "family": config.family,
        "layers": config.num_layers,
        "parameters": count,
        "dtype": dtype,
        "max_abs_logit": float(jnp.max(jnp.abs(logits))),
        "written": None if out is None else str(out),
    }
