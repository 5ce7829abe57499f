"""LoRA adapters (`jaxrl_llm.models.lora`): the formula, the start at the base model, gradients
and the merged export, against float64 NumPy and `transformers`.

- An adapted model (B = 0) computes its base model's logits.
- With random B, the forward equals the merged model's, and `merge_lora`'s weights equal
  `W + s · A·B` computed in float64 NumPy per layer, for every target layout (q/k/v `[D,H,Hd]`,
  o `[H,Hd,D]`, gate/up/down), with the α/r and rsLoRA α/√r scales.
- Only the adapters train under `LORA_PATTERN`; at B = 0 the gradient of A is zero and that of
  B is not (the LoRA start).
- `save_pretrained` writes the merged model: `transformers` loads it and computes the adapted
  model's logits (float64 reference).
- `save_lora_adapter` writes PEFT's format: `peft.PeftModel` on the `transformers` base model
  computes the adapted model's logits (float64), and `load_lora_adapter` reads the adapters
  back exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.config import ConfigError
from jaxrl_llm.models import Decoder, ModelConfig, save_pretrained
from jaxrl_llm.models.lora import (
    LORA_PATTERN,
    TARGETS,
    LoRAConfig,
    add_lora,
    has_lora,
    lora_parameter_count,
    merge_lora,
)
from jaxrl_llm.train import split_models

CFG = ModelConfig(
    family="qwen3",
    vocab_size=23,
    hidden_size=16,
    intermediate_size=24,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    tie_embeddings=False,
)
HOST_TARGETS = {"attn": ("q", "k", "v", "o"), "mlp": ("gate", "up", "down")}
TOKENS = jnp.array([[3, 5, 7, 11, 2], [1, 4, 9, 16, 22]])
POSITIONS = jnp.broadcast_to(jnp.arange(5), (2, 5))


def _adapted(config: LoRAConfig, *, random_b: bool, seed: int = 0):
    base = Decoder(CFG, rngs=nnx.Rngs(seed))
    model = add_lora(nnx.clone(base), config, rngs=nnx.Rngs(seed + 1))
    if random_b:  # move B off zero so that the adapters change the model
        key = jax.random.key(seed + 2)
        for host in (model.layers.attn, model.layers.mlp):
            for name in TARGETS:
                b = getattr(host, f"{name}_lora_b", None)
                if b is not None:
                    key, sub = jax.random.split(key)
                    b.set_value(0.05 * jax.random.normal(sub, b[...].shape))
    return base, model


def test_an_adapted_model_starts_as_its_base_model():
    base, model = _adapted(LoRAConfig(rank=4), random_b=False)
    # x·A·B is exactly 0 while B = 0; the layer scan's program differs (float rounding only)
    np.testing.assert_allclose(model(TOKENS, POSITIONS), base(TOKENS, POSITIONS), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "config",
    [
        LoRAConfig(rank=4, alpha=8.0),
        LoRAConfig(rank=3, alpha=2.0, targets=("q", "o", "down"), use_rslora=True),
    ],
    ids=["all-targets", "q-o-down-rslora"],
)
def test_the_forward_equals_the_merged_weights_of_a_float64_reference(config):
    base, model = _adapted(config, random_b=True)
    merged = merge_lora(model)
    assert has_lora(model) and not has_lora(merged)
    scale = config.alpha / (np.sqrt(config.rank) if config.use_rslora else config.rank)
    for host_name in ("attn", "mlp"):
        host, merged_host = getattr(model.layers, host_name), getattr(merged.layers, host_name)
        for name in HOST_TARGETS[host_name]:
            w = np.asarray(getattr(host, name)[...], np.float64)
            if name not in config.targets:
                assert getattr(host, f"{name}_lora_a", None) is None
                np.testing.assert_array_equal(getattr(merged_host, name)[...], w)
                continue
            a = np.asarray(getattr(host, f"{name}_lora_a")[...], np.float64)
            b = np.asarray(getattr(host, f"{name}_lora_b")[...], np.float64)
            for layer in range(CFG.num_layers):
                a_l = a[layer].reshape(-1, config.rank)  # [fan_in, r]
                b_l = b[layer].reshape(config.rank, -1)  # [r, fan_out]
                expected = w[layer] + scale * (a_l @ b_l).reshape(w[layer].shape)
                np.testing.assert_allclose(
                    getattr(merged_host, name)[...][layer], expected, rtol=1e-6, atol=1e-7
                )
    logits = model(TOKENS, POSITIONS)
    assert float(jnp.max(jnp.abs(logits - base(TOKENS, POSITIONS)))) > 1e-3  # B moved it
    np.testing.assert_allclose(logits, merged(TOKENS, POSITIONS), rtol=1e-5, atol=1e-5)


def test_only_the_adapters_train_and_a_gets_no_gradient_at_the_start():
    config = LoRAConfig(rank=2)
    _, model = _adapted(config, random_b=False)
    graphs, params, frozen = split_models(model, trainable=(LORA_PATTERN,))
    names = sorted(".".join(map(str, p)) for p, _ in nnx.to_flat_state(params["policy"]))
    assert names == sorted(
        f"layers.{h}.{n}_lora_{s}"
        for h, ns in (("attn", "qkvo"), ("mlp", ("gate", "up", "down")))
        for n in ns
        for s in "ab"
    )
    D, F, H, K, Hd, L, r = 16, 24, 4, 2, 8, 2, 2
    per_layer = r * ((D + H * Hd) * 2 + (D + K * Hd) * 2 + (D + F) * 3)  # q, o; k, v; mlp
    assert lora_parameter_count(model) == L * per_layer

    def loss(trainable):
        m = nnx.merge(graphs.policy, trainable, frozen["policy"])
        return jnp.mean(m(TOKENS, POSITIONS)[..., 0] ** 2)

    grads = jax.grad(loss)(params["policy"])
    for path, value in nnx.to_flat_state(grads):
        norm = float(jnp.linalg.norm(value[...]))
        if path[-1].endswith("_lora_a"):
            assert norm == 0.0, path  # dL/dA = s·xᵀ(dL/dy)Bᵀ = 0 while B = 0
        else:
            assert norm > 0.0, path


def test_save_pretrained_writes_the_merged_model_that_transformers_runs(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    _, model = _adapted(LoRAConfig(rank=4, alpha=4.0), random_b=True)
    save_pretrained(model, tmp_path)
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).double().eval()
    with torch.no_grad():
        theirs = reference(torch.tensor(np.asarray(TOKENS))).logits.numpy()
    np.testing.assert_allclose(model(TOKENS, POSITIONS), theirs, rtol=1e-4, atol=1e-4)


def test_lora_errors_name_the_problem():
    with pytest.raises(ConfigError, match="`rank` must be an int >= 1"):
        LoRAConfig(rank=0)
    with pytest.raises(ConfigError, match="`alpha` must be a finite number > 0"):
        LoRAConfig(alpha=0.0)
    _, model = _adapted(LoRAConfig(rank=2), random_b=False)
    with pytest.raises(ValueError, match="already has LoRA adapters"):
        add_lora(model, LoRAConfig(rank=2), rngs=nnx.Rngs(0))


def test_the_sampler_draws_with_the_adapters_merged_once_per_call_or_at_every_token():
    from jaxrl_llm.sampler import generate

    base, model = _adapted(LoRAConfig(rank=4, alpha=8.0), random_b=True)
    prompts = [[3, 5, 7], [1, 4]]
    kw = {"max_new_tokens": 6, "key": jax.random.key(3), "num_samples": 2, "stop_tokens": ()}
    merged = generate(merge_lora(model), prompts, **kw)
    for merge in (True, False):  # merged inside the program, or `s·(x·A)·B` at every token
        adapted = generate(model, prompts, merge_lora=merge, **kw)
        np.testing.assert_array_equal(adapted.tokens, merged.tokens, err_msg=str(merge))
        np.testing.assert_allclose(adapted.logprobs, merged.logprobs, rtol=1e-4, atol=1e-4)
    plain = generate(base, prompts, **kw)
    assert float(np.max(np.abs(np.asarray(plain.logprobs) - np.asarray(adapted.logprobs)))) > 1e-3


@pytest.mark.parametrize(
    "config",
    [
        LoRAConfig(rank=4, alpha=8.0),
        LoRAConfig(rank=3, alpha=2.0, targets=("k", "o", "up"), use_rslora=True),
    ],
    ids=["all-targets", "k-o-up-rslora"],
)
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_peft_runs_the_saved_adapter_and_it_loads_back(tmp_path, config):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from jaxrl_llm.models.lora_io import load_lora_adapter, save_lora_adapter

    base, model = _adapted(config, random_b=True)
    save_pretrained(base, tmp_path / "base")
    save_lora_adapter(model, tmp_path / "adapter", base_model=str(tmp_path / "base"))
    hf_base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    reference = peft.PeftModel.from_pretrained(hf_base, tmp_path / "adapter").double().eval()
    with torch.no_grad():
        theirs = reference(torch.tensor(np.asarray(TOKENS))).logits.numpy()
    np.testing.assert_allclose(model(TOKENS, POSITIONS), theirs, rtol=1e-4, atol=1e-4)

    loaded = load_lora_adapter(nnx.clone(base), tmp_path / "adapter")
    ours, again = nnx.state(model), nnx.state(loaded)
    for (path, a), (_, b) in zip(nnx.to_flat_state(ours), nnx.to_flat_state(again), strict=True):
        np.testing.assert_array_equal(a[...], b[...], err_msg=str(path))
    assert loaded.layers.attn.lora_config == config


def test_unsupported_peft_adapters_are_refused_by_name(tmp_path):
    import json

    from jaxrl_llm.models.lora_io import CONFIG_FILE, load_lora_adapter, save_lora_adapter

    base, model = _adapted(LoRAConfig(rank=2, targets=("q",)), random_b=False)
    out = save_lora_adapter(model, tmp_path / "adapter")
    written = json.loads((out / CONFIG_FILE).read_text())
    assert (written["r"], written["lora_alpha"], written["target_modules"]) == (2, 16.0, ["q_proj"])
    for key, value, message in [
        ("bias", "all", "`bias` = 'all' is not supported"),
        ("layers_to_transform", [0], "`layers_to_transform` = \\[0\\] is not supported"),
        ("target_modules", "q_proj|v_proj", "must be a list of module names"),
        ("target_modules", ["lm_head"], "unknown `targets`"),
        ("lora_bias", True, "`lora_bias` = True is not supported"),
        ("trainable_token_indices", [1, 2], "`trainable_token_indices` = \\[1, 2\\] is not"),
        # PiSSA / OLoRA / LoftQ adapters apply to a residual base PEFT rebuilds when loading
        ("init_lora_weights", "pissa", "`init_lora_weights` = 'pissa' is not supported"),
        ("init_lora_weights", "olora", "path_initial_model_for_weight_conversion"),
        # aLoRA acts only after its invocation tokens
        ("alora_invocation_tokens", [5], "`alora_invocation_tokens` = \\[5\\] is not"),
        ("target_modules", ["model.layers.1.self_attn.q_proj"], "in layers \\[1\\] of 2"),
        ("target_modules", ["model.embed_tokens"], "'model.embed_tokens' is not a layer's"),
    ]:
        (out / CONFIG_FILE).write_text(json.dumps({**written, key: value}))
        with pytest.raises(ValueError, match=message):
            load_lora_adapter(nnx.clone(base), out)
    # PEFT's "all-linear" writes each layer's module name: every layer is the short target
    per_layer = [f"model.layers.{i}.self_attn.q_proj" for i in (1, 0)]
    for init in (True, "gaussian"):
        (out / CONFIG_FILE).write_text(
            json.dumps({**written, "target_modules": per_layer, "init_lora_weights": init})
        )
        loaded = load_lora_adapter(nnx.clone(base), out)
        assert loaded.layers.attn.lora_config == LoRAConfig(rank=2, targets=("q",))
        np.testing.assert_array_equal(
            loaded.layers.attn.q_lora_a[...], model.layers.attn.q_lora_a[...]
        )
    (out / CONFIG_FILE).write_text(json.dumps(written))
    # a tensor the adapters do not use (a B bias, a deeper model's layer) is not dropped
    from safetensors.numpy import load_file, save_file

    from jaxrl_llm.models.lora_io import WEIGHTS_FILE

    tensors = load_file(str(out / WEIGHTS_FILE))
    extra = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias"
    save_file({**tensors, extra: np.zeros(4, np.float32)}, str(out / WEIGHTS_FILE))
    with pytest.raises(
        ValueError, match=r"tensors this model's adapters do not use: .*lora_B\.bias"
    ):
        load_lora_adapter(nnx.clone(base), out)
    save_file(tensors, str(out / WEIGHTS_FILE))
    with pytest.raises(ValueError, match="without LoRA adapters"):
        load_lora_adapter(model, out)
