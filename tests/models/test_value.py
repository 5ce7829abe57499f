"""Value heads (critics, reward models) and rematerialisation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("torch")
from flax import nnx

from jaxrl_llm.models import Decoder, ValueHead, ValueModel, from_pretrained, save_pretrained
from tests.models.conftest import (
    hf_config,
    jit_forward,
    positions_for,
    random_tokens,
    torch,
    transformers,
)

TOL = 1e-4


def _hf_reward_model(family: str):
    torch.manual_seed(0)
    config = hf_config(family, num_labels=1, pad_token_id=0)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def _scores(model, tokens):
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits[:, 0].numpy()


@pytest.mark.parametrize("family", ["qwen2", "gemma2"])
def test_reward_model_import_and_export_match_transformers(family, tmp_path):
    hf = _hf_reward_model(family)
    hf.save_pretrained(tmp_path / "hf")
    model = from_pretrained(tmp_path / "hf", head="value")
    assert isinstance(model, ValueModel)
    tokens = random_tokens((3, 7), seed=6) + 1  # no pad id (0): the score is at the last token
    values = jit_forward(model, tokens, positions_for(tokens))
    assert values.shape == (3, 7) and values.dtype == np.float32
    np.testing.assert_allclose(values[:, -1], _scores(hf, tokens), atol=TOL, rtol=0)
    save_pretrained(model, tmp_path / "ours")
    back = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "ours")
    back.config._attn_implementation = "eager"
    np.testing.assert_allclose(_scores(back.eval(), tokens), values[:, -1], atol=TOL, rtol=0)


def test_critic_from_policy_checkpoint_keeps_the_backbone(hf_checkpoints):
    path = hf_checkpoints["llama"][1]  # untied: lm_head.weight is present and not loaded
    policy = from_pretrained(path)
    critic = from_pretrained(path, head="value", seed=3)
    assert not hasattr(critic.backbone, "lm_head")
    tokens = jnp.asarray(random_tokens((2, 5), seed=7))
    positions = jnp.asarray(positions_for(np.asarray(tokens)))
    np.testing.assert_array_equal(
        np.asarray(critic.backbone.hidden_states(tokens, positions)),
        np.asarray(policy.hidden_states(tokens, positions)),
    )
    fresh = ValueHead(policy.config.hidden_size, rngs=nnx.Rngs(3)).kernel[...]
    np.testing.assert_array_equal(np.asarray(critic.head.kernel[...]), np.asarray(fresh))


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_gives_the_same_gradients(hf_checkpoints, remat):
    path = hf_checkpoints["gemma2"][1]
    tokens = jnp.asarray(random_tokens((2, 6), seed=8))
    positions = jnp.asarray(positions_for(np.asarray(tokens)))

    def grads(model: Decoder):
        graphdef, state = nnx.split(model)

        def loss(state):
            logits = nnx.merge(graphdef, state)(tokens, positions)
            return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

        return jax.jit(jax.grad(loss))(state)

    plain, rematted = (
        grads(from_pretrained(path, remat="none")),
        grads(from_pretrained(path, remat=remat)),
    )
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(rematted), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="remat must be"):
        Decoder(from_pretrained(path).config, remat="some", rngs=nnx.Rngs(0))


def test_every_family_exports_its_reward_model_as_the_text_scorer_class():
    """The `architectures` of a ValueModel export is transformers' sequence-classification
    class of the family: Gemma 3 (text) once wrote the multimodal Gemma3ForSequenceClassification,
    which tools that read `architectures` (vLLM, getattr(transformers, name)) cannot load."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    )

    from jaxrl_llm.models import ModelConfig
    from jaxrl_llm.models._hf_config import SUPPORTED_FAMILIES

    for family in SUPPORTED_FAMILIES:
        cfg = ModelConfig(family=family, vocab_size=8, hidden_size=8, intermediate_size=8,
                          num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)  # fmt: skip
        assert cfg.scorer_architecture == MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES[family]
        assert hasattr(transformers, cfg.scorer_architecture)
