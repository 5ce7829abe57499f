"""DoRA (`LoRAConfig(use_dora=True)`): the forward, the gradients and the file format against
Hugging Face PEFT (float64 torch), the merge and the sampler's per-rollout fold.

- An adapted model starts as its base model (m = ‖W‖ over the input axes).
- With random B and m, PEFT's `PeftModel` on the `transformers` base model, reading our saved
  adapter, computes our logits; the merged model and `save_pretrained`'s checkpoint too.
- The gradients of A, B and m equal PEFT's (whose weight norm is a constant of the gradient,
  DoRA §4.3): a convention that a formula-only test would miss.
- `load_lora_adapter` reads a DoRA adapter back exactly; the sampler's fold
  (`fold_dora_magnitudes`) draws the tokens of the merged model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.models import save_pretrained
from jaxrl_llm.models.lora import (
    LORA_PATTERN,
    TARGETS,
    LoRAConfig,
    fold_dora_magnitudes,
    has_lora,
    lora_parameter_count,
    merge_lora,
)
from jaxrl_llm.models.lora_io import load_lora_adapter, save_lora_adapter
from jaxrl_llm.train import split_models
from tests.models.test_lora import CFG, POSITIONS, TOKENS, _adapted

DORA = LoRAConfig(rank=3, alpha=6.0, targets=("q", "v", "o", "up", "down"), use_dora=True)


def _dora(config: LoRAConfig = DORA):
    """A base model and its DoRA copy with B and m moved off their starting values."""
    base, model = _adapted(config, random_b=True)
    key = jax.random.key(7)
    for host in (model.layers.attn, model.layers.mlp):
        for name in TARGETS:
            m = getattr(host, f"{name}_lora_m", None)
            if m is not None:
                key, sub = jax.random.split(key)
                m.set_value(m[...] * (1.0 + 0.3 * jax.random.normal(sub, m[...].shape)))
    return base, model


def _peft_model(tmp_path, base, model):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    save_pretrained(base, tmp_path / "base")
    save_lora_adapter(model, tmp_path / "adapter", base_model=str(tmp_path / "base"))
    hf_base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    return peft.PeftModel.from_pretrained(hf_base, tmp_path / "adapter", is_trainable=True)


def test_a_dora_model_starts_as_its_base_model_and_its_magnitudes_are_the_column_norms():
    base, model = _adapted(DORA, random_b=False)
    np.testing.assert_allclose(model(TOKENS, POSITIONS), base(TOKENS, POSITIONS), atol=1e-6)
    q = np.asarray(base.layers.attn.q[...], np.float64)  # [L, D, H, Hd]
    np.testing.assert_allclose(
        model.layers.attn.q_lora_m[...], np.sqrt((q**2).sum(axis=1)), rtol=1e-6
    )
    o = np.asarray(base.layers.attn.o[...], np.float64)  # [L, H, Hd, D]
    np.testing.assert_allclose(
        model.layers.attn.o_lora_m[...], np.sqrt((o**2).sum(axis=(1, 2))), rtol=1e-6
    )
    assert getattr(model.layers.attn, "k_lora_m", None) is None  # k is not a target
    magnitudes = 2 * (4 * 8 + 2 * 8 + 16 + 24 + 16)  # L · (q, v, o, up, down outputs)
    adapters = 2 * 3 * ((16 + 32) * 2 + (16 + 16) + (16 + 24) * 2)
    assert lora_parameter_count(model) == adapters + magnitudes


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_peft_computes_our_logits_and_the_merge_folds_them(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    base, model = _dora()
    reference = _peft_model(tmp_path, base, model).double().eval()
    with torch.no_grad():
        theirs = reference(torch.tensor(np.asarray(TOKENS))).logits.numpy()
    ours = model(TOKENS, POSITIONS)
    lora_only = merge_lora(_adapted(DORA, random_b=True)[1])  # same A, B; magnitudes at start
    assert float(jnp.max(jnp.abs(ours - lora_only(TOKENS, POSITIONS)))) > 1e-3  # m matters
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)

    merged = merge_lora(model)
    assert not has_lora(merged)
    np.testing.assert_allclose(merged(TOKENS, POSITIONS), ours, rtol=1e-5, atol=1e-5)
    save_pretrained(model, tmp_path / "merged")
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").double()
    with torch.no_grad():
        np.testing.assert_allclose(
            exported(torch.tensor(np.asarray(TOKENS))).logits.numpy(), theirs, atol=1e-4
        )


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_the_gradients_of_a_b_and_m_equal_pefts(tmp_path):
    torch = pytest.importorskip("torch")
    base, model = _dora()
    reference = _peft_model(tmp_path, base, model).double().train()
    weights = np.asarray(jax.random.normal(jax.random.key(11), (*TOKENS.shape, CFG.vocab_size)))

    logits = reference(torch.tensor(np.asarray(TOKENS))).logits
    (logits * torch.tensor(weights, dtype=torch.float64)).sum().backward()
    theirs = {
        name.replace(".default", "").replace("vector.weight", "vector"): p.grad.numpy()
        for name, p in reference.named_parameters()
        if p.requires_grad
    }

    graphs, params, frozen = split_models(model, trainable=(LORA_PATTERN,))

    def loss(trainable):
        m = nnx.merge(graphs.policy, trainable, frozen["policy"])
        return jnp.sum(m(TOKENS, POSITIONS) * weights)

    grads = jax.grad(loss)(params["policy"])
    as_model = nnx.merge(graphs.policy, grads, frozen["policy"])  # the gradients in A, B, m
    save_lora_adapter(as_model, tmp_path / "grads")
    from safetensors.numpy import load_file

    ours = load_file(str(tmp_path / "grads" / "adapter_model.safetensors"))
    assert sorted(ours) == sorted(theirs) and any("magnitude" in k for k in ours)
    for name, grad in ours.items():
        scale = np.max(np.abs(theirs[name]))
        assert scale > 0, name
        np.testing.assert_allclose(grad, theirs[name], rtol=0, atol=2e-4 * scale, err_msg=name)


def test_a_dora_adapter_loads_back_and_the_sampler_folds_the_magnitudes(tmp_path):
    from jaxrl_llm.sampler import generate

    base, model = _dora()
    loaded = load_lora_adapter(nnx.clone(base), save_lora_adapter(model, tmp_path / "adapter"))
    assert loaded.layers.attn.lora_config == DORA
    ours, again = nnx.state(model), nnx.state(loaded)
    for (path, a), (_, b) in zip(nnx.to_flat_state(ours), nnx.to_flat_state(again), strict=True):
        np.testing.assert_array_equal(a[...], b[...], err_msg=str(path))

    folded = fold_dora_magnitudes(nnx.clone(model))
    assert has_lora(folded) and getattr(folded.layers.attn, "q_lora_m", None) is None
    np.testing.assert_allclose(
        folded(TOKENS, POSITIONS), model(TOKENS, POSITIONS), rtol=1e-5, atol=1e-5
    )
    prompts = [[3, 5, 7], [1, 4]]
    kw = {"max_new_tokens": 6, "key": jax.random.key(3), "num_samples": 2, "stop_tokens": ()}
    merged = generate(merge_lora(model), prompts, **kw)
    for merge in (True, False):  # merged in the program, or folded magnitudes and `(x·A)·B`
        adapted = generate(model, prompts, merge_lora=merge, **kw)
        np.testing.assert_array_equal(adapted.tokens, merged.tokens, err_msg=str(merge))
        np.testing.assert_allclose(adapted.logprobs, merged.logprobs, rtol=1e-4, atol=1e-4)
