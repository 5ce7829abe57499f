"""Checkpoints that do not fit the run: one clear line naming the mismatch, exit status 2.

Through `--resume` (the run's orbax checkpoints, copied from the reference run): another model
width, another model family, a corrupt file, a truncated file. Through `model.checkpoint` (a
Hugging Face directory): a vocabulary smaller than the tokenizer's, a config.json that does
not match the tensors, a truncated safetensors file. The `Checkpointer` and `from_pretrained`
checks themselves are tested in `tests/checkpoint/` (test_checkpoint.py: mismatch errors;
test_corruption.py: every flipped byte) and `tests/models/test_loading_errors.py`.
"""

from __future__ import annotations

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.models import Decoder, ModelConfig, save_pretrained
from tests.reliability.helpers import GRPO, RUN, copy_run, final_state, user_error
from tests.runner.helpers import TINY_MODEL

# after a read of damaged files fails, orbax's background threads may report a closed asyncio
# loop or an unclosed TensorStore handle at garbage collection: noise, not a test outcome
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _resume(capsys, run_dir, *overrides):
    argv = ["train", GRPO, *RUN, *overrides, "--resume", "--run-dir", str(run_dir)]
    return user_error(capsys, argv)


def _largest_array_file(step_dir):
    """The biggest file of the step's parameter data (OCDBT chunks under state/.../d/)."""
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    return max(files, key=lambda p: p.stat().st_size)


def test_resume_with_another_model_width_names_the_leaves_and_shapes(
    capsys, tmp_path, reference_run
):
    run_dir = copy_run(reference_run, tmp_path / "run")
    err = _resume(capsys, run_dir, "model.init.intermediate_size=48")
    assert "Checkpointer.restore: step 6 in" in err
    assert "does not match the target state (a checkpoint of a different model or config?)" in err
    assert (
        "params.policy.layers.mlp.down.value: checkpoint (1, 32, 16) float32 vs target "
        "(1, 48, 16) float32" in err
    ), err


def test_resume_with_another_model_family_names_the_missing_leaves(capsys, tmp_path, reference_run):
    run_dir = copy_run(reference_run, tmp_path / "run")
    err = _resume(capsys, run_dir, "model.init.family=llama")  # no q/k norms in Llama
    assert "does not match the target state" in err
    assert "only in the checkpoint: " in err and "params.policy.layers.attn.k_norm" in err, err


def _middle_of_largest_frame(data):
    """The middle byte of the file's largest zstd frame: inside stored values, never a frame or
    block header. (The file's middle byte can be the first byte of a frame when the file holds
    two chunks of equal size; a flipped header bit is reported as unreadable, not corrupt.)"""
    magic = b"\x28\xb5\x2f\xfd"  # a zstd frame's first four bytes
    starts = [i for i in range(len(data) - 3) if data[i : i + 4] == magic]
    if not starts:  # uncompressed chunks
        return len(data) // 2
    bounds = [*starts, len(data)]
    start, end = max(itertools.pairwise(bounds), key=lambda b: b[1] - b[0])
    return (start + end) // 2


def _damage(run_dir, how):
    path = _largest_array_file(run_dir / "checkpoints" / "6")
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[_middle_of_largest_frame(data)] ^= 0x01  # one bit of stored values
    else:
        del data[len(data) // 2 :]  # a partial file: the copy or the disk stopped halfway
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("flip", "is corrupt: the restored values of "),  # ... differ (checksum mismatch ...)
        ("truncate", "is unreadable (corrupt or truncated files: ValueError: OUT_OF_RANGE"),
    ],
)
def test_resume_from_a_damaged_checkpoint_names_it_and_the_way_back(
    capsys, tmp_path, reference_run, damage, expected
):
    run_dir = copy_run(reference_run, tmp_path / "run")
    _damage(run_dir, damage)
    err = _resume(capsys, run_dir)
    assert f"Checkpointer.restore: step 6 in {run_dir / 'checkpoints'} {expected}" in err, err
    assert f"move {run_dir / 'checkpoints' / '6'} away to restore step 4 instead" in err, err
    (run_dir / "checkpoints" / "6").rename(tmp_path / "step6_damaged")
    step, _, _ = final_state(run_dir)  # the advice works: step 4 restores
    assert step == 4


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    """A Hugging Face checkpoint of the runs' tiny Qwen3 model with a 200-token vocabulary."""
    config = ModelConfig(family="qwen3", vocab_size=200, **TINY_MODEL)
    graph, shapes = nnx.split(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(0)  # host draws: no per-op compiles of an eager init
    weights = jax.tree.map(lambda a: jnp.asarray(rng.normal(0, 0.02, a.shape), a.dtype), shapes)
    path = tmp_path_factory.mktemp("hf") / "tiny"
    save_pretrained(nnx.merge(graph, weights), path)
    return path


def _train_from(capsys, checkpoint, run_dir):
    argv = ["train", GRPO, *RUN, "model.init=null", f"model.checkpoint={checkpoint}"]
    return user_error(capsys, [*argv, "--run-dir", str(run_dir)])


def test_model_checkpoint_with_a_smaller_vocabulary_than_the_tokenizer(
    capsys, tmp_path, hf_checkpoint
):
    err = _train_from(capsys, hf_checkpoint, tmp_path)
    assert err == (
        "jaxrl-llm train: tokenizer.path: the tokenizer has 259 token ids, the model's "
        "vocabulary only 200."
    )


def test_model_checkpoint_whose_config_does_not_match_its_tensors(capsys, tmp_path, hf_checkpoint):
    copy = tmp_path / "ckpt"
    copy.mkdir()
    for file in hf_checkpoint.iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "vocab_size": 259}))
    err = _train_from(capsys, copy, tmp_path / "run")
    assert "model.embed_tokens.weight: expected (259, 16), found (200, 16)" in err, err


def test_model_checkpoint_with_a_truncated_weights_file(capsys, tmp_path, hf_checkpoint):
    copy = tmp_path / "ckpt"
    copy.mkdir()
    for file in hf_checkpoint.iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    err = _train_from(capsys, copy, tmp_path / "run")
    assert "model.safetensors: truncated or corrupt" in err, err


def test_resume_from_a_checkpoint_of_another_loop_names_its_missing_metadata(
    capsys, tmp_path, reference_run, monkeypatch
):
    """A checkpoint of the same model written by a loop of one's own (docs/
    checkpoints_and_metrics.md) restored, then failed with a KeyError traceback."""
    from jaxrl_llm.checkpoint import Checkpointer

    run_dir = copy_run(reference_run, tmp_path / "run")
    restore = Checkpointer.restore

    def without_loop_metadata(self, *args, **kwargs):
        state, meta = restore(self, *args, **kwargs)
        return state, {"step": meta["step"]}

    monkeypatch.setattr(Checkpointer, "restore", without_loop_metadata)
    err = _resume(capsys, run_dir)
    assert "was not written by `jaxrl-llm train`: its metadata lacks data, skips_consecutive" in err
