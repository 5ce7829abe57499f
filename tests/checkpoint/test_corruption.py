"""Damaged checkpoints never restore silently: checksums, unreadable files, the way back.

The checksum of a leaf is `(Σ_i w_i, Σ_i mix(w_i)) mod 2³²` over its 32-bit words, with
`mix(w) = (w ⊕ (w >> 15))·0x9E3779B1 mod 2³²` (jaxrl_llm/checkpoint.py); the reference here is
written with NumPy from that formula.
"""

from __future__ import annotations

import gc
import json
import sys
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.checkpoint import Checkpointer
from tests.checkpoint.helpers import assert_bitwise_equal, leaf_bytes

# after a read of damaged files fails, orbax's background threads may report a closed asyncio
# loop or an unclosed TensorStore handle at garbage collection: noise, not a test outcome
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(autouse=True)
def _collect_orbax_garbage():
    """Collect that garbage here, under this module's filter, instead of in whichever test the
    worker runs next (where it surfaced as PytestUnraisableExceptionWarnings)."""
    yield
    gc.collect()


def _state(offset: float = 0.0):
    rng = np.random.default_rng(3)
    return {
        "w": jnp.asarray(rng.normal(size=(24, 16)) + offset, jnp.float32),
        "h": jnp.asarray(rng.normal(size=(5,)) + offset, jnp.bfloat16),
        "i": jnp.asarray(rng.integers(-100, 100, size=(7,)) + int(offset), jnp.int8),
        "u": jnp.asarray(rng.integers(0, 2**32, size=(3,), dtype=np.uint64), jnp.uint32),
        "ok": jnp.asarray([True, False, True]),
        "key": jax.random.key(7 + int(offset)),
    }


def _reference_checksum(leaf) -> list[int]:
    """NumPy, from the formula: the leaf's bits as 32-bit words (narrower types widened)."""
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
    value = np.asarray(leaf)
    if value.dtype == np.bool_:
        words = value.astype(np.uint64)
    else:
        unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32}[value.dtype.itemsize]
        words = value.view(unsigned).astype(np.uint64)
    mixed = ((words ^ (words >> 15)) * 0x9E3779B1) % 2**32
    return [int(words.sum() % 2**32), int(mixed.sum() % 2**32)]


def _saved(tmp_path, steps=(1, 2)):
    with Checkpointer(tmp_path, save_every=1, async_save=False) as ckpt:
        for step in steps:
            ckpt.save(step, _state(float(step)), {"step": step})
    return tmp_path


def _restore(directory, step=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # skipped unreadable steps warn; not under test here
        with Checkpointer(directory, save_every=1) as ckpt:
            return ckpt.restore(step, target_state=_state())


def test_checksums_on_disk_match_a_numpy_reference(tmp_path):
    _saved(tmp_path, steps=(1,))
    on_disk = json.loads((tmp_path / "1" / "checksums" / "metadata").read_text())
    expected = {name: _reference_checksum(leaf) for name, leaf in _state(1.0).items()}
    assert on_disk == expected


def test_every_flipped_byte_is_caught_or_harmless(tmp_path):
    """One byte flipped at a time in every file of step 2's state: the restore either raises a
    ValueError naming step 2, or returns exactly the saved values; never a silent change."""
    _saved(tmp_path)
    saved = _state(2.0)
    files = sorted(p for p in (tmp_path / "2" / "state").rglob("*") if p.is_file())
    outcomes = {"checksum": 0, "unreadable": 0, "incomplete": 0, "harmless": 0}
    for path in files:
        original = path.read_bytes()
        for offset in sorted({0, len(original) // 3, len(original) // 2, len(original) - 1}):
            damaged = bytearray(original)
            damaged[offset] ^= 0x04
            path.write_bytes(bytes(damaged))
            try:
                state, _ = _restore(tmp_path, 2)
            except ValueError as err:
                text = str(err)
                if "checksum mismatch" in text:
                    outcomes["checksum"] += 1
                    assert "step 2 in" in text and "restore step 1 instead" in text, text
                elif "is unreadable" in text:
                    outcomes["unreadable"] += 1
                    assert "step 2 in" in text and "restore step 1 instead" in text, text
                else:
                    outcomes["incomplete"] += 1  # damaged metadata: not a complete step
                    assert "`step` 2 has no complete checkpoint" in text, text
            else:
                assert_bitwise_equal(state, saved), (path.name, offset)
                outcomes["harmless"] += 1
            finally:
                path.write_bytes(original)
    assert outcomes["checksum"] > 0, outcomes  # silent value changes are what checksums catch
    assert outcomes["unreadable"] > 0 and outcomes["incomplete"] > 0, outcomes
    state, meta = _restore(tmp_path)  # the repaired step restores again
    assert meta == {"step": 2}
    assert_bitwise_equal(state, saved)


def _largest_array_file(step_dir):
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    return max(files, key=lambda p: p.stat().st_size)


def test_truncated_latest_step_names_it_and_the_way_back(tmp_path):
    """A partial array file (a copy or a disk that stopped halfway) of the newest step."""
    _saved(tmp_path)
    path = _largest_array_file(tmp_path / "2")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError) as err:
        _restore(tmp_path)
    text = str(err.value)
    assert f"step 2 in {tmp_path} is unreadable (corrupt or truncated files: " in text, text
    assert f"move {tmp_path / '2'} away to restore step 1 instead" in text, text
    (tmp_path / "2").rename(tmp_path.parent / f"{tmp_path.name}_step2")
    state, meta = _restore(tmp_path)
    assert meta == {"step": 1}
    assert_bitwise_equal(state, _state(1.0))


def test_a_damaged_only_step_has_no_fallback(tmp_path):
    _saved(tmp_path, steps=(1,))
    path = _largest_array_file(tmp_path / "1")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match="there is no older complete step to fall back to"):
        _restore(tmp_path)


def test_unreadable_metadata_is_named_when_nothing_else_is_left(tmp_path):
    """Every file of the only step emptied: its metadata cannot be read either."""
    _saved(tmp_path, steps=(1,))
    for path in (tmp_path / "1" / "state").rglob("*"):
        if path.is_file():
            path.write_bytes(b"")
    with pytest.raises(ValueError) as err:
        _restore(tmp_path)
    text = str(err.value)
    assert f"no complete checkpoint in {tmp_path} (step(s) [1] cannot be read" in text, text


def test_checkpoints_without_checksums_restore_unchecked(tmp_path):
    """Checkpoints written before checksums existed have no `checksums` item."""
    _saved(tmp_path, steps=(1,))
    for path in sorted((tmp_path / "1" / "checksums").iterdir()):
        path.unlink()
    (tmp_path / "1" / "checksums").rmdir()
    state, meta = _restore(tmp_path)
    assert meta == {"step": 1}
    assert [leaf_bytes(x) for x in jax.tree.leaves(state)] == [
        leaf_bytes(x) for x in jax.tree.leaves(_state(1.0))
    ]


def test_stray_reports_of_a_failed_restore_are_dropped(tmp_path, monkeypatch):
    """After a read fails, orbax's reads still in flight post to a closed event loop; Python
    would print each as an unraisable RuntimeError with a traceback (timing-dependent, so
    checked here on the hook that a restore installs before it reads: the first stray report
    can come before the failed read's exception, as it once did in a full test run)."""
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    _saved(tmp_path, steps=(1,))
    path = _largest_array_file(tmp_path / "1")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match="is unreadable"):
        _restore(tmp_path)
    for message in ("Event loop is closed", "something else"):
        sys.unraisablehook(types.SimpleNamespace(exc_value=RuntimeError(message)))
    errors = [str(u.exc_value) for u in reported if isinstance(u.exc_value, RuntimeError)]
    assert errors == ["something else"]  # (other reports, e.g. ResourceWarnings, pass through)


def test_the_way_back_names_the_newest_older_step(tmp_path):
    """Three steps, the newest truncated: the advice names step 2, not the oldest."""
    _saved(tmp_path, steps=(1, 2, 3))
    path = _largest_array_file(tmp_path / "3")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"away to restore step 2 instead"):
        _restore(tmp_path)


def test_a_step_without_its_meta_item_is_not_complete(tmp_path):
    """A step whose `meta` item is gone (a save that stopped between its items) is skipped for
    the older complete one, and listed as unreadable."""
    import shutil

    _saved(tmp_path, steps=(2, 4))
    shutil.rmtree(tmp_path / "4" / "meta")
    with Checkpointer(tmp_path, save_every=1) as ckpt:
        assert ckpt.latest_step() == 2 and ckpt.unreadable_steps() == [4]
    _, meta = _restore(tmp_path)
    assert meta == {"step": 2}


def test_the_mixed_checksum_catches_what_the_plain_sum_misses():
    """[0x8000, 0x8001] and [0, 0x10001] have the same sum of words; the second sum, of the
    mixed words, differs (a two-word change that keeps the sum, which byte flips never do)."""
    from jaxrl_llm.checkpoint import _checksums, _verify_checksums

    saved = _checksums({"w": jnp.array([0x8000, 0x8001], jnp.uint32)})
    assert (
        _reference_checksum(jnp.array([0x8000, 0x8001], jnp.uint32))[0]
        == _reference_checksum(jnp.array([0, 0x10001], jnp.uint32))[0]
    )
    with pytest.raises(ValueError):
        _verify_checksums({"w": jnp.array([0, 0x10001], jnp.uint32)}, saved, where="s", advice="a")
