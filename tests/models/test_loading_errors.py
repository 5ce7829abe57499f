"""Bad checkpoints and configs fail before any model is built, with a message naming the problem."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxrl_llm.models import ModelConfig, from_pretrained
from tests.models.conftest import hf_config


@pytest.fixture
def checkpoint(hf_checkpoints, tmp_path):
    """A writable copy of the tiny Qwen3 checkpoint."""
    path = tmp_path / "ckpt"
    shutil.copytree(hf_checkpoints["qwen3"][1], path)
    return path


def _rewrite(path, edit):
    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def test_truncated_file_names_the_file(checkpoint):
    file = checkpoint / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"model\.safetensors: truncated or corrupt"):
        from_pretrained(checkpoint)


def test_missing_and_unexpected_tensors_are_listed(checkpoint):
    def edit(tensors):
        del tensors["model.layers.1.self_attn.k_norm.weight"]
        tensors["model.layers.0.mlp.extra.weight"] = np.zeros(3, np.float32)

    _rewrite(checkpoint, edit)
    with pytest.raises(ValueError) as err:
        from_pretrained(checkpoint)
    message = str(err.value)
    assert "missing tensors (1): model.layers.1.self_attn.k_norm.weight" in message
    assert "unexpected tensors (1): model.layers.0.mlp.extra.weight" in message


def test_wrong_shape_is_named(checkpoint):
    _rewrite(checkpoint, lambda t: t.update({"model.norm.weight": np.ones(7, np.float32)}))
    with pytest.raises(ValueError, match=r"model\.norm\.weight: expected \(40,\), found \(7,\)"):
        from_pretrained(checkpoint)


def test_integer_tensors_and_quantized_configs_are_refused(checkpoint):
    _rewrite(checkpoint, lambda t: t.update({"model.norm.weight": np.ones(40, np.int8)}))
    with pytest.raises(
        ValueError, match=r"model\.norm\.weight: expected a floating-point tensor, found I8"
    ):
        from_pretrained(checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    quantized = {**config, "quantization_config": {"quant_method": "fp8"}}
    (checkpoint / "config.json").write_text(json.dumps(quantized))
    with pytest.raises(ValueError, match=r"quantization_config \('fp8': quantized checkpoints"):
        from_pretrained(checkpoint)


def test_a_single_file_beside_an_index_is_the_one_read(checkpoint):
    """As `transformers` does: `model.safetensors` first, the index only without it."""
    expected = from_pretrained(checkpoint)
    tensors = load_file(str(checkpoint / "model.safetensors"))
    shard = "model-00001-of-00001.safetensors"
    save_file({k: v + 1 for k, v in tensors.items()}, str(checkpoint / shard))
    index = {"weight_map": dict.fromkeys(tensors, shard)}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(index))
    np.testing.assert_array_equal(
        from_pretrained(checkpoint).final_norm.scale[...], expected.final_norm.scale[...]
    )
    (checkpoint / "model.safetensors").unlink()
    np.testing.assert_array_equal(
        from_pretrained(checkpoint).final_norm.scale[...], expected.final_norm.scale[...] + 1
    )


def test_unsupported_family_and_options(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "model_type": "mixtral"}))
    with pytest.raises(ValueError, match="unsupported model_type 'mixtral'; supported families"):
        from_pretrained(checkpoint)
    yarn = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}
    with pytest.raises(ValueError, match="unsupported rope type 'yarn'"):
        ModelConfig.from_hf(hf_config("qwen2", rope_parameters=yarn))
    with pytest.raises(ValueError, match="mlp_bias=true"):
        ModelConfig.from_hf(hf_config("llama", mlp_bias=True))
    with pytest.raises(ValueError, match="hidden_act='relu'"):
        ModelConfig.from_hf(hf_config("qwen3", hidden_act="relu"))


def test_missing_files_are_reported(checkpoint, tmp_path):
    with pytest.raises(ValueError, match=r"no config\.json"):
        from_pretrained(tmp_path / "nowhere")
    (checkpoint / "model.safetensors").unlink()
    with pytest.raises(
        ValueError, match=r"no model\.safetensors or model\.safetensors\.index\.json"
    ):
        from_pretrained(checkpoint)
    index = {"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="names files that are not in"):
        from_pretrained(checkpoint)


def test_bad_model_config_values():
    dims = dict(vocab_size=11, hidden_size=8, intermediate_size=16, num_layers=2, head_dim=4)
    with pytest.raises(ValueError, match="num_heads=3 is not a multiple of num_kv_heads=2"):
        ModelConfig(family="llama", num_heads=3, num_kv_heads=2, **dims)
    with pytest.raises(ValueError, match="need a positive sliding_window"):
        ModelConfig(
            family="gemma2",
            num_heads=2,
            num_kv_heads=1,
            layer_types=("sliding_attention", "full_attention"),
            **dims,
        )
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        ModelConfig(family="gpt2", num_heads=2, num_kv_heads=1, **dims)
