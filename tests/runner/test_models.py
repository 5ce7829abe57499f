"""The run's models: random initialisations (one compiled program, the values of the eager
construction) and the export (weights and the run's tokenizer)."""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.models import Decoder, ModelConfig, ValueModel
from jaxrl_llm.runner.models import compiled_init, export_policy
from jaxrl_llm.tokenizer import load_tokenizer
from jaxrl_llm.train import split_models
from tests.compile_settings import optimisations

CFG = ModelConfig(
    family="qwen3",
    vocab_size=19,
    hidden_size=16,
    intermediate_size=24,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    tie_embeddings=False,
)


@pytest.fixture
def production_compiles():
    """XLA's default optimisations, on fresh caches, for this test only.

    The suite compiles with most optimisations off (`tests/compile_settings.py`), and JAX's
    caches of eager operations are not keyed by that setting: eager draws compiled by an
    earlier test would be reused with the other setting and differ from the compiled
    initialisation by an ulp. Bit-equality is the claim for real runs, which compile with the
    defaults.
    """
    with optimisations(True):
        jax.clear_caches()
        yield
    jax.clear_caches()


@pytest.mark.parametrize("cls", [Decoder, ValueModel])
def test_compiled_init_equals_the_eager_construction(cls, production_compiles):
    compiled = nnx.state(compiled_init(lambda: cls(CFG, rngs=nnx.Rngs(3))))
    eager = nnx.state(cls(CFG, rngs=nnx.Rngs(3)))
    assert jax.tree.structure(compiled) == jax.tree.structure(eager)
    for a, b in zip(jax.tree.leaves(compiled), jax.tree.leaves(eager), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bit for bit
    other = nnx.state(compiled_init(lambda: cls(CFG, rngs=nnx.Rngs(4))))
    assert not np.array_equal(
        np.asarray(jax.tree.leaves(other)[0]), np.asarray(jax.tree.leaves(eager)[0])
    )

    # the seed as the program's argument, the program kept under a key: the same values, and
    # another seed runs the kept program (the factory is not traced again)
    built = []

    def factory(rngs):
        built.append(rngs)
        return cls(CFG, rngs=rngs)

    key = ("test_models", cls.__name__, object())  # this test's own program
    keyed = nnx.state(compiled_init(factory, seed=3, key=key))
    for a, b in zip(jax.tree.leaves(keyed), jax.tree.leaves(eager), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    again = nnx.state(compiled_init(factory, seed=4, key=key))
    assert len(built) == 1
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(other), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="pass `seed` too"):
        compiled_init(lambda: cls(CFG, rngs=nnx.Rngs(0)), key=key)


def test_the_export_holds_the_runs_transformers_tokenizer(tmp_path):
    """An exported run is a complete `model.checkpoint` for the next stage: the weights and,
    for a `transformers` tokenizer, its files (chat template included)."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    words = ["<pad>", "<s>", "</s>", "<unk>", "the", "cat", "sat"]
    backend = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")
    )
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = "{{ messages[0]['content'] }}</s>"
    fast.save_pretrained(tmp_path / "tokenizer")
    tokenizer = load_tokenizer(tmp_path / "tokenizer", chat_template=True)
    graphs, params, frozen = split_models(Decoder(CFG, rngs=nnx.Rngs(0)))
    out = export_policy(
        graphs, params["policy"], frozen["policy"], tmp_path / "export", None, tokenizer
    )
    again = load_tokenizer(out, chat_template=True)
    assert again.encode("the cat sat", add_bos=False, add_eos=True) == [4, 5, 6, 2]
    assert again.render([{"role": "user", "content": "the cat"}]) == "the cat</s>"
    assert (out / "model.safetensors").is_file()
    byte = export_policy(
        graphs, params["policy"], frozen["policy"], tmp_path / "b", None, load_tokenizer("byte")
    )
    assert sorted(p.name for p in byte.iterdir()) == ["config.json", "model.safetensors"]


def test_the_export_and_convert_keep_the_checkpoints_generation_config(tmp_path):
    """An instruct checkpoint's `generation_config.json` (extra EOS ids, sampling defaults)
    goes with the export of a run that started from it and with `convert --out`, so that
    `transformers` generates as before; a randomly initialised run has none to keep."""
    transformers = pytest.importorskip("transformers")
    from jaxrl_llm.models import save_pretrained
    from jaxrl_llm.models.convert import check_checkpoint

    base = tmp_path / "base"
    save_pretrained(Decoder(CFG, rngs=nnx.Rngs(0)), base)
    settings = {"eos_token_id": [257, 258], "do_sample": True, "temperature": 0.7}
    (base / "generation_config.json").write_text(json.dumps(settings))
    graphs, params, frozen = split_models(Decoder(CFG, rngs=nnx.Rngs(1)))
    runs = {
        "export": export_policy(
            graphs,
            params["policy"],
            frozen["policy"],
            tmp_path / "export",
            None,
            base_model=str(base),
        ),
        "convert": pathlib.Path(check_checkpoint(base, out=tmp_path / "convert")["written"]),
    }
    for name, out in runs.items():
        loaded = transformers.GenerationConfig.from_pretrained(str(out))
        assert loaded.eos_token_id == [257, 258], name
        assert (loaded.do_sample, loaded.temperature) == (True, 0.7), name
    fresh = export_policy(graphs, params["policy"], frozen["policy"], tmp_path / "fresh", None)
    assert not (fresh / "generation_config.json").exists()


def test_a_run_whose_budgets_exceed_the_model_context_warns(tmp_path, caplog):
    """P + T over `max_position_embeddings`: the run goes on (RoPE continues) with a warning
    naming both budgets, as `generate` warns."""
    import logging

    from jaxrl_llm.runner import load_run_config, prepare_run
    from tests.runner.helpers import CONFIGS, TINY

    overrides = [*TINY, "model.init.max_position_embeddings=6"]
    config = load_run_config(str(CONFIGS / "grpo.yaml"), overrides, run_dir=tmp_path / "run")
    with caplog.at_level(logging.WARNING, logger="jaxrl_llm"):
        prepared = prepare_run(config)
    prepared.checkpointer.close()
    task = prepared.context.task
    assert task.prompt_length + task.completion_length > 6
    assert "over the model's context of 6 positions" in caplog.text, caplog.text
    assert f"({task.completion_length})" in caplog.text


def test_a_preference_run_checks_its_pair_lengths_against_the_context(tmp_path, caplog):
    """A preference run samples nothing: the warning is about `preference_data`'s two budgets,
    and `sampling.max_new_tokens` does not enter it."""
    import logging

    from jaxrl_llm.runner import load_run_config, prepare_run
    from tests.runner.helpers import CONFIGS, PREFERENCE

    def warnings_for(context):
        overrides = [
            *PREFERENCE,
            "model.init.max_position_embeddings=" + str(context),
            "preference_data.max_prompt_length=24",
            "preference_data.max_completion_length=8",
            "sampling.max_new_tokens=100",
        ]
        run_dir = tmp_path / str(context)
        config = load_run_config(str(CONFIGS / "dpo.yaml"), overrides, run_dir=run_dir)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="jaxrl_llm"):
            prepare_run(config).checkpointer.close()
        return [r.getMessage() for r in caplog.records if "model's context" in r.getMessage()]

    assert warnings_for(32) == []  # 24 + 8 fit; 24 + 100 would not
    (message,) = warnings_for(31)
    assert "preference_data.max_prompt_length (24 tokens) plus " in message, message
    assert "preference_data.max_completion_length (8)" in message, message
