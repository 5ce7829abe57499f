"""Logits parity with `transformers` (the numerical reference) and checkpoint round trips."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("torch")

from flax import nnx

from jaxrl_llm.models import Decoder, ModelConfig, from_pretrained, save_pretrained
from tests.models.conftest import (
    DIMS,
    FAMILIES,
    jit_forward,
    positions_for,
    random_tokens,
    torch,
    torch_logits,
    transformers,
)

TOL = 1e-4  # float32, max abs difference of logits


@pytest.mark.parametrize("family", FAMILIES)
def test_loaded_checkpoint_matches_transformers(hf_checkpoints, family):
    torch_model, path = hf_checkpoints[family]
    tokens = random_tokens((3, 11), seed=1)
    model = from_pretrained(path)
    ours = jit_forward(model, tokens, positions_for(tokens))
    ref = torch_logits(torch_model, tokens)
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, atol=TOL, rtol=0)
    assert np.abs(ref).max() > 1.0  # the comparison is not between near-zero logits


@pytest.mark.parametrize("family", FAMILIES)
def test_save_pretrained_round_trips_through_transformers(hf_checkpoints, family, tmp_path):
    _, path = hf_checkpoints[family]
    model = from_pretrained(path)
    _check_export_matches_in_transformers(model, tmp_path)
    assert ModelConfig.from_json_file(tmp_path) == model.config


def _check_export_matches_in_transformers(model, path):
    """`save_pretrained(model, path)`, loaded by `transformers`, computes our logits."""
    save_pretrained(model, path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    reloaded.config._attn_implementation = "eager"
    tokens = random_tokens((2, 9), seed=2)
    ours = jit_forward(model, tokens, positions_for(tokens))
    np.testing.assert_allclose(torch_logits(reloaded.eval(), tokens), ours, atol=TOL, rtol=0)


def test_sharded_index_is_written_and_read(hf_checkpoints, tmp_path):
    torch_model, path = hf_checkpoints["qwen3"]
    save_pretrained(from_pretrained(path), tmp_path, max_shard_bytes=20_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and not (tmp_path / "model.safetensors").exists()
    assert files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    tokens = random_tokens((2, 6), seed=3)
    ours = jit_forward(from_pretrained(tmp_path), tokens, positions_for(tokens))
    np.testing.assert_allclose(ours, torch_logits(torch_model, tokens), atol=TOL, rtol=0)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    np.testing.assert_allclose(torch_logits(reloaded.eval(), tokens), ours, atol=TOL, rtol=0)


def test_an_export_replaces_the_one_before_and_a_failed_one_keeps_it(
    hf_checkpoints, tmp_path, monkeypatch
):
    """A sharded export, then a single-file one into the same directory: no stale shards. Then
    a save that fails while writing (a full disk): the directory still holds the last export,
    its config with its own weights, and no half-written file."""
    import safetensors.numpy

    _, path = hf_checkpoints["qwen3"]
    first = from_pretrained(path)
    graphdef, state = nnx.split(first)
    second = nnx.merge(graphdef, jax.tree.map(lambda x: 0.5 * x, state))
    save_pretrained(first, tmp_path, max_shard_bytes=20_000)
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 2
    save_pretrained(second, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    tokens = random_tokens((2, 6), seed=3)
    expected = jit_forward(second, tokens, positions_for(tokens))

    def full_disk(tensors, filename, metadata=None):
        pathlib.Path(filename).write_bytes(b"half a shard")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.numpy, "save_file", full_disk)
    with pytest.raises(OSError, match="No space left"):
        save_pretrained(first, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    again = jit_forward(from_pretrained(tmp_path), tokens, positions_for(tokens))
    np.testing.assert_array_equal(again, expected)


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text"])
def test_gemma_defaults_are_written_as_transformers_needs_them(family, tmp_path):
    """`query_pre_attn_scalar` None (the scale head_dim ** -0.5) is written as the int
    `transformers` requires, and full attention everywhere as a window as long as the context
    (its Gemma 2/3 build a window mask whatever `layer_types` says)."""
    dims = {k: v for k, v in DIMS.items() if k not in ("num_hidden_layers",)}
    dims["num_layers"], dims["num_heads"] = 2, dims.pop("num_attention_heads")
    dims["num_kv_heads"] = dims.pop("num_key_value_heads")
    config = ModelConfig(family=family, **dims)
    _check_export_matches_in_transformers(Decoder(config, rngs=nnx.Rngs(0)), tmp_path)
    back = ModelConfig.from_json_file(tmp_path)
    expected = dataclasses.replace(config, query_pre_attn_scalar=DIMS["head_dim"])
    if family == "gemma3_text":  # local_rope None (the global rope) is written out
        expected = dataclasses.replace(expected, local_rope=config.rope)
    assert back == expected
    with pytest.raises(ValueError, match=r"takes an integer query_pre_attn_scalar, got 8\.5"):
        dataclasses.replace(config, query_pre_attn_scalar=8.5).to_hf_dict()


def test_bfloat16_checkpoint_and_dtype_policy(hf_checkpoints, tmp_path):
    torch_model, _ = hf_checkpoints["llama"]
    torch_model.to(torch.bfloat16).save_pretrained(tmp_path)
    torch_model.to(torch.float32)
    ref_embed = (
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
        .model.embed_tokens.weight.float()
        .detach()
        .numpy()
    )
    f32 = from_pretrained(tmp_path)  # bf16 on disk, upcast exactly on the host
    assert f32.embed[...].dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(f32.embed[...]), ref_embed)
    mixed = from_pretrained(tmp_path, dtype=jnp.bfloat16, param_dtype=jnp.float32)
    bf16 = from_pretrained(tmp_path, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    assert mixed.layers.attn.q[...].dtype == jnp.float32
    assert bf16.layers.attn.q[...].dtype == jnp.bfloat16
    tokens = random_tokens((2, 5), seed=4)
    for model in (mixed, bf16):
        hidden = model.hidden_states(jnp.asarray(tokens), jnp.asarray(positions_for(tokens)))
        assert hidden.dtype == jnp.bfloat16
        assert model.logits(hidden).dtype == jnp.float32
    save_pretrained(bf16, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    again = from_pretrained(tmp_path / "out", param_dtype=jnp.bfloat16)
    np.testing.assert_array_equal(
        np.asarray(again.layers.mlp.down[...]), np.asarray(bf16.layers.mlp.down[...])
    )


@pytest.mark.parametrize(
    ("family", "overrides"),
    [
        # transformers' Llama and Gemma attend fully whatever `layer_types` says
        ("llama", dict(layer_types=["sliding_attention", "full_attention"], sliding_window=3)),
        ("gemma", dict(layer_types=["sliding_attention", "full_attention"], sliding_window=3)),
        # transformers' Gemma 3 reads attn_logit_softcapping and never applies it
        ("gemma3_text", dict(attn_logit_softcapping=0.5)),
    ],
)
def test_config_keys_transformers_ignores_are_ignored(family, overrides, tmp_path):
    from tests.models.conftest import hf_model

    torch_model = hf_model(family, **overrides)
    torch_model.save_pretrained(tmp_path)
    tokens = random_tokens((2, 11), seed=2)
    model = from_pretrained(tmp_path)
    assert "sliding_attention" not in model.config.layer_types or family == "gemma3_text"
    assert model.config.attn_logit_softcap is None or family != "gemma3_text"
    ours = jit_forward(model, tokens, positions_for(tokens))
    np.testing.assert_allclose(ours, torch_logits(torch_model, tokens), atol=TOL, rtol=0)
    if family == "gemma3_text":  # nor is it exported: transformers would not apply it
        capped = ModelConfig(**{**model.config.__dict__, "attn_logit_softcap": 0.5})
        with pytest.raises(ValueError, match="gemma3_text has no attention logit soft-capping"):
            capped.to_hf_dict()


def test_rmsnorm_rounds_as_the_reference_implementations():
    """Llama / Qwen: the normalised value is rounded to the input dtype, then multiplied by the
    weight in that dtype (one bf16 multiply after the cast, as transformers' LlamaRMSNorm);
    eps keeps an all-zero row at 0 instead of NaN (mutation testing)."""
    from jaxrl_llm.models.layers import RMSNorm

    norm = RMSNorm(64, eps=1e-6, plus_one=False, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    scale = jnp.asarray(1.0 + 0.3 * rng.normal(size=64), jnp.bfloat16)
    norm.scale[...] = scale
    x = jnp.asarray(rng.normal(size=(4, 64)), jnp.bfloat16)
    x32 = np.asarray(x, np.float32)
    normed = x32 / np.sqrt(np.mean(x32**2, axis=-1, keepdims=True) + 1e-6)
    want = scale * jnp.asarray(normed, jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(norm(x), np.float32), np.asarray(want, np.float32))
    np.testing.assert_array_equal(norm(jnp.zeros((1, 64), jnp.bfloat16)), 0.0)


def test_a_tied_checkpoint_that_also_stores_lm_head_loads(tmp_path):
    """Some tied checkpoints keep a redundant `lm_head.weight` (a copy of the embedding): it is
    ignored on load, not an unexpected tensor."""
    from safetensors.numpy import load_file, save_file

    cfg = ModelConfig(
        family="qwen2",
        vocab_size=11,
        hidden_size=8,
        intermediate_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=4,
        tie_embeddings=True,
    )
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    save_pretrained(model, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    loaded = from_pretrained(tmp_path)
    tokens = jnp.arange(6, dtype=jnp.int32)[None]
    np.testing.assert_array_equal(loaded(tokens, tokens), model(tokens, tokens))
