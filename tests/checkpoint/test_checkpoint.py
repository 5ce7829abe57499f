"""`Checkpointer`: exact round trips, schedule, retention, resume, mismatch errors, bad input."""

from __future__ import annotations

import json
import shutil
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.checkpoint import (
    CheckpointConfig,
    Checkpointer,
    IncompleteCheckpointWarning,
    abstract_target,
)
from jaxrl_llm.config import ConfigError, build
from jaxrl_llm.data import IteratorState
from tests.checkpoint.helpers import (
    CFG,
    assert_bitwise_equal,
    leaf_bytes,
    make_state,
    train_step,
)


@pytest.fixture(scope="module")
def trained():
    """A state after two updates: adamw moments, counts and key are all non-trivial."""
    return train_step(train_step(make_state(0)))


@pytest.mark.parametrize("async_save", [True, False])
def test_round_trip_is_bitwise_including_typed_key_and_meta(tmp_path, trained, async_save):
    meta = {
        "data": IteratorState(seed=3, epoch=1, position=17)._asdict(),
        "config_hash": "abc123",
        "metrics": {"reward/mean": [0.25, 0.5], "best": None, "nan": float("nan")},
    }
    with Checkpointer(tmp_path, save_every=1, async_save=async_save) as ckpt:
        assert ckpt.save(2, trained, meta)
        ckpt.wait()
        assert ckpt.all_steps() == [2]
    fresh = make_state(5)  # same structure and shardings, different values
    with Checkpointer(tmp_path, save_every=1) as ckpt:
        restored, got_meta = ckpt.restore(target_state=fresh)
    assert_bitwise_equal(restored, trained)
    assert jax.dtypes.issubdtype(restored.key.dtype, jax.dtypes.prng_key)
    assert IteratorState.from_dict(got_meta["data"]) == IteratorState(3, 1, 17)
    assert got_meta["config_hash"] == "abc123"
    assert got_meta["metrics"]["reward/mean"] == [0.25, 0.5] and got_meta["metrics"]["best"] is None
    assert np.isnan(got_meta["metrics"]["nan"])
    # restored keys work as keys: the same draws as the saved key
    np.testing.assert_array_equal(
        jax.random.uniform(restored.key, (4,)), jax.random.uniform(trained.key, (4,))
    )


def test_rbg_key_round_trips_and_a_key_impl_change_is_a_mismatch(tmp_path):
    state = make_state(1, impl="rbg")
    with Checkpointer(tmp_path, save_every=1, async_save=False) as ckpt:
        ckpt.save(0, state, {})
        restored, _ = ckpt.restore(target_state=make_state(2, impl="rbg"))
        assert_bitwise_equal(restored, state)
        with pytest.raises(ValueError, match=r"key: checkpoint \(4,\) uint32 vs target \(2,\)"):
            ckpt.restore(target_state=make_state(2))  # threefry keys are 2 words, rbg 4


def test_restore_from_abstract_target(tmp_path, trained):
    with Checkpointer(tmp_path, save_every=1, async_save=False) as ckpt:
        ckpt.save(4, trained, {})
        abstract = jax.eval_shape(lambda: make_state(9))
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        abstract = jax.tree.map(
            lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), abstract
        )
        restored, _ = ckpt.restore(4, target_state=abstract)
    assert_bitwise_equal(restored, trained)


def test_async_save_survives_deleting_the_buffers_right_after(tmp_path):
    """The loop donates the state to the next step: the save must not read it afterwards."""
    state = {"w": jax.random.normal(jax.random.key(0), (512, 256)), "key": jax.random.key(7)}
    expected = jax.tree.map(leaf_bytes, state)
    with Checkpointer(tmp_path, save_every=1, async_save=True) as ckpt:
        assert ckpt.save(1, state, {})
        for leaf in jax.tree.leaves(state):
            leaf.delete()
        ckpt.wait()
        target = {
            "w": jnp.zeros((512, 256)),
            "key": jax.random.key(0),
        }
        restored, _ = ckpt.restore(target_state=target)
    assert jax.tree.map(leaf_bytes, restored) == expected


def test_resume_continues_bit_for_bit(tmp_path):
    """6 updates in one go == 3 updates, checkpoint, new process state, restore, 3 updates."""
    straight = make_state(0)
    for _ in range(6):
        straight = train_step(straight)

    state = make_state(0)
    with Checkpointer(tmp_path, save_every=3) as ckpt:
        for step in range(1, 4):
            state = train_step(state)
            ckpt.maybe_save(step, state, {"data": {"seed": 0, "epoch": 0, "position": step}})
    del state
    with Checkpointer(tmp_path, save_every=3) as ckpt:
        assert ckpt.latest_step() == 3
        resumed, meta = ckpt.restore(target_state=make_state(1))
    assert int(resumed.step) == 3 and meta["data"]["position"] == 3
    for _ in range(3):
        resumed = train_step(resumed)
    assert_bitwise_equal(resumed, straight)


def test_schedule_retention_and_repeated_final_save(tmp_path):
    x = {"x": jnp.arange(4.0)}
    with Checkpointer(tmp_path, save_every=2, keep=2, async_save=False) as ckpt:
        saved = [
            ckpt.maybe_save(s, jax.tree.map(lambda a, s=s: a + s, x), {"s": s}) for s in range(7)
        ]
        assert saved == [True, False, True, False, True, False, True]
        assert ckpt.all_steps() == [4, 6]  # keep=2
        assert not ckpt.save(6, x, {"s": 6})  # the final save of a step saved periodically
        assert ckpt.save(7, x, {"s": 7})  # an off-schedule final step
        assert ckpt.all_steps() == [6, 7]
        state, meta = ckpt.restore(6, target_state=x)
        np.testing.assert_array_equal(state["x"], np.arange(4.0) + 6)
        assert meta == {"s": 6}
    with Checkpointer(tmp_path, save_every=2, keep=None, async_save=False) as ckpt:
        for s in (8, 10, 12):
            ckpt.save(s, x, {})
        assert ckpt.all_steps() == [6, 7, 8, 10, 12]


def test_mismatched_model_error_names_paths_and_shapes(tmp_path, trained):
    bigger = CFG.__class__(**{**CFG.__dict__, "hidden_size": 24})
    with Checkpointer(tmp_path, save_every=1, async_save=False) as ckpt:
        ckpt.save(2, trained, {})
        with pytest.raises(ValueError) as err:
            ckpt.restore(target_state=make_state(0, bigger))
    text = str(err.value)
    assert "step 2 in" in text and "does not match the target state" in text
    assert "params.policy.embed.value: checkpoint (64, 16) float32 vs target (64, 24) float32" in (
        text
    )
    assert "... and" in text  # many more mismatches than listed


def test_missing_extra_and_dtype_mismatches_are_named(tmp_path):
    state = {"a": jnp.zeros((2,), jnp.float32), "b": {"c": jnp.zeros((3,), jnp.int32)}}
    with Checkpointer(tmp_path, save_every=1, async_save=False) as ckpt:
        ckpt.save(0, state, {})
        target = {"a": jnp.zeros((2,), jnp.bfloat16), "b": {"d": jnp.zeros((3,), jnp.int32)}}
        with pytest.raises(ValueError) as err:
            ckpt.restore(target_state=target)
    text = str(err.value)
    assert "not in the checkpoint: b.d" in text
    assert "only in the checkpoint: b.c" in text
    assert "a: checkpoint (2,) float32 vs target (2,) bfloat16" in text


class _Before(NamedTuple):  # a state type as an older release saved it
    step: jax.Array
    w: jax.Array


class _After(NamedTuple):  # the same type with a field added since, empty in most runs
    step: jax.Array
    w: jax.Array
    added: Any = None


def test_a_field_added_to_the_state_type_restores_as_none_from_older_checkpoints(tmp_path):
    old = _Before(jnp.array(3, jnp.int32), jnp.arange(4.0))
    with Checkpointer(tmp_path, save_every=1, async_save=False) as ckpt:
        ckpt.save(3, old, {})
        state, _ = ckpt.restore(target_state=_After(jnp.array(0, jnp.int32), jnp.zeros(4)))
        assert type(state) is _After and state.added is None
        np.testing.assert_array_equal(state.w, old.w)
        assert int(state.step) == 3
        with pytest.raises(ValueError, match="not in the checkpoint: added"):
            ckpt.restore(target_state=_After(old.step, old.w, jnp.zeros(2)))  # not empty: needed


def test_unfinished_and_unreadable_steps_are_skipped_with_a_warning(tmp_path):
    x = {"x": jnp.arange(3.0)}
    with Checkpointer(tmp_path, save_every=1, async_save=False) as ckpt:
        ckpt.save(1, x, {"s": 1})
        ckpt.save(2, jax.tree.map(lambda a: a + 1, x), {"s": 2})
    # step 3: a save stopped before its rename; step 2: its state item lost after the rename
    (tmp_path / "3.orbax-checkpoint-tmp").mkdir()
    (tmp_path / "3.orbax-checkpoint-tmp" / "partial").write_text("x")
    shutil.rmtree(tmp_path / "2" / "state")
    with pytest.warns(IncompleteCheckpointWarning, match="save of step 3 .* did not finish"):
        ckpt = Checkpointer(tmp_path, save_every=1)
    with ckpt:
        assert ckpt.all_steps() == [1] and ckpt.latest_step() == 1
        with pytest.warns(IncompleteCheckpointWarning, match=r"skipping step\(s\) \[2, 3\]"):
            state, meta = ckpt.restore(target_state=x)
        assert meta == {"s": 1}
        np.testing.assert_array_equal(state["x"], np.arange(3.0))
        with pytest.raises(ValueError, match=r"`step` 2 has no complete checkpoint.*: \[1\]"):
            ckpt.restore(2, target_state=x)
        # the resumed run reaches step 2 again: the broken step is replaced
        with pytest.warns(IncompleteCheckpointWarning, match="step 2 .* incomplete .* replacing"):
            assert ckpt.save(2, jax.tree.map(lambda a: a + 5, x), {"s": 2})
        state, meta = ckpt.restore(target_state=x)
        assert meta == {"s": 2}
        np.testing.assert_array_equal(state["x"], np.arange(3.0) + 5)
    assert not (tmp_path / "3.orbax-checkpoint-tmp").exists()  # orbax cleaned it up


def test_restore_without_checkpoints_is_a_clear_error(tmp_path):
    with Checkpointer(tmp_path / "new", save_every=1) as ckpt:
        assert ckpt.latest_step() is None
        with pytest.raises(ValueError, match=r"no complete checkpoint in .*new"):
            ckpt.restore(target_state={"x": jnp.zeros(2)})


def test_bad_arguments_are_named(tmp_path):
    for kwargs, message in (
        ({"save_every": 0}, "`save_every` must be an int >= 1, got 0"),
        ({"save_every": 2.0}, "`save_every` must be an int >= 1, got 2.0"),
        ({"save_every": 1, "keep": 0}, "`keep` must be an int >= 1, got 0"),
        ({"save_every": 1, "async_save": "yes"}, "`async_save` must be a bool"),
    ):
        with pytest.raises(ValueError, match=message):
            Checkpointer(tmp_path, **kwargs)
    with pytest.raises(ValueError, match="`directory` must be a non-empty path"):
        Checkpointer("", save_every=1)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is not a directory"):
        Checkpointer(tmp_path / "file", save_every=1)
    x = {"x": jnp.zeros(2)}
    with Checkpointer(tmp_path / "ok", save_every=1, async_save=False) as ckpt:
        with pytest.raises(ValueError, match="`step` must be an int >= 0, got -1"):
            ckpt.save(-1, x, {})
        with pytest.raises(ValueError, match=r"`meta\['data'\]` = IteratorState.*_asdict"):
            ckpt.save(1, x, {"data": IteratorState(0, 0, 1)})
        with pytest.raises(ValueError, match=r"`meta\['m'\]` is not JSON-serialisable"):
            ckpt.save(1, x, {"m": np.float32(1.0)})
        with pytest.raises(ValueError, match="`meta` keys must be str, got 1"):
            ckpt.save(1, x, {1: 2})
        with pytest.raises(ValueError, match=r"save: leaf 'x' must be a jax\.Array .* got ndarray"):
            ckpt.save(1, {"x": np.zeros(2)}, {})
        assert ckpt.all_steps() == []
        ckpt.save(1, x, {})
        with pytest.raises(
            ValueError, match=r"restore: leaf 'x' is a jax\.ShapeDtypeStruct without"
        ):
            ckpt.restore(target_state={"x": jax.ShapeDtypeStruct((2,), jnp.float32)})


def test_abstract_target_keeps_shardings_and_key_dtypes():
    state = {"w": jnp.ones((2, 3)), "key": jax.random.key(0)}
    target = abstract_target(state)
    assert target["w"].sharding == state["w"].sharding
    assert target["key"].dtype == state["key"].dtype and target["key"].shape == ()


def test_config_builds_and_validates(tmp_path):
    cfg = build(CheckpointConfig, {"every": 25, "keep": None, "async_save": False})
    assert cfg == CheckpointConfig(every=25, keep=None, async_save=False)
    with pytest.raises(ConfigError, match="unknown key 'evry'"):
        build(CheckpointConfig, {"evry": 3})
    with pytest.raises(ValueError, match="`keep` must be an int >= 1, got -1"):
        CheckpointConfig(keep=-1)
    with Checkpointer.from_config(tmp_path, cfg) as ckpt:
        assert ckpt.save_every == 25
    with pytest.raises(ValueError, match="must be a CheckpointConfig"):
        Checkpointer.from_config(tmp_path, {"every": 3})


def test_meta_file_is_plain_json_on_disk(tmp_path):
    with Checkpointer(tmp_path, save_every=1, async_save=False) as ckpt:
        ckpt.save(5, {"x": jnp.zeros(1)}, {"position": 5})
    files = [p for p in (tmp_path / "5" / "meta").iterdir() if p.name == "metadata"]
    assert len(files) == 1 and json.loads(files[0].read_text()) == {"position": 5}
