"""Orbax checkpoints of the train state: periodic async saves, atomic steps, sharded restore.

One step directory `DIR/<step>/` holds three items:

    state   the train state pytree (`TrainState`: params, optimizer state, step, typed PRNG
            key, KL controller ...), written with `orbax` `StandardSave`: every process writes
            the shards it holds (OCDBT, one file set per process), so a multi-host run never
            gathers the parameters on one host;
    meta    a JSON mapping chosen by the training loop (data iterator position
            `IteratorState._asdict()`, config hash, metrics so far ...), written by process 0;
    checksums  two 32-bit checksums per leaf of `state` (JSON), computed on the devices
            before the save and checked after every restore.

Guarantees (each pinned by a test in `tests/checkpoint/`):

- **Atomic.** Orbax writes a step into `<step>.orbax-checkpoint-tmp` and renames it to
  `<step>` only when every item is complete. A process killed during a save leaves the previous
  steps intact; `Checkpointer` reports the unfinished step with an `IncompleteCheckpointWarning`
  and never restores it (orbax removes the temporary directory when the next `Checkpointer`
  opens the directory).
- **Asynchronous.** With `async_save=True`, `save` returns once the arrays are copied off the
  devices; files are written by a background thread, so the caller may donate or delete the
  state's buffers right away. `wait()` blocks until the last save is on disk.
- **Exact.** A restored state is bit-for-bit the saved one, typed PRNG keys (`jax.random.key`)
  included, so a resumed run continues exactly where it stopped.
- **Resharding.** `restore` reads onto the shardings of the *target* (`jax.Array` leaves or
  `jax.ShapeDtypeStruct(shape, dtype, sharding=...)`): a checkpoint written on a mesh
  (data=8, fsdp=1, tensor=1) restores onto (2, 2, 2) or onto one device.
- **Checked.** Restoring into a target of another model raises a `ValueError` that names the
  first mismatching leaves and both shapes / dtypes, before any data is read.
- **Verified.** The array files are compressed without a checksum of their own, so a flipped
  bit on disk can restore as a silently different value. Each leaf's stored bits are therefore
  summarised as `(Σ_i w_i, Σ_i mix(w_i)) mod 2³²` over its 32-bit words `w_i` (16- and 8-bit
  values widened, 64-bit values split in two, typed keys as their key data; `mix(w) = (w ⊕
  (w >> 15))·0x9E3779B1`). Integer sums are exact in any order, so the checksums do not
  depend on the sharding: a resharded restore is checked too. A restored leaf whose checksums
  differ, or a file that orbax cannot read (truncated, missing), raises a `ValueError` naming
  the step, the leaves or the cause, and the older step to fall back to; a step whose
  metadata cannot be read is skipped like an unfinished one, with a warning
  (`unreadable_steps`). Checkpoints written before checksums existed restore unchecked.
  `tests/checkpoint/test_corruption.py` flips bytes in every file of a step: each flip raises
  or restores the saved values exactly, never a silently different value.

Multi-host: every process constructs the `Checkpointer` on the same (shared) directory and calls
`maybe_save` / `save` / `restore` with the same steps; orbax synchronises the processes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import re
import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

__all__ = [
    "CheckpointConfig",
    "Checkpointer",
    "IncompleteCheckpointWarning",
    "StateMismatchError",
    "abstract_target",
]

_STATE = "state"
_META = "meta"
_CHECKSUMS = "checksums"
_MIX = 0x9E3779B1  # an odd multiplier (2^32 / golden ratio): mixes the bits of each word
_TMP_STEP = re.compile(r"^(\d+)\.orbax-checkpoint-tmp")
_MAX_LISTED = 5


class IncompleteCheckpointWarning(UserWarning):
    """A step whose save did not finish (the process stopped mid-save); it is never restored.

    Examples:
      >>> import warnings
      >>> with warnings.catch_warnings(record=True) as caught:
      ...     warnings.simplefilter("always")
      ...     warnings.warn("step 7 did not finish", IncompleteCheckpointWarning)
      >>> caught[0].category.__name__
      'IncompleteCheckpointWarning'
    """


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """When and how checkpoints are written (the `checkpoint:` section of a training config).

    Attributes:
      every: save every `every` update steps (step % every == 0); the loop also saves at the end.
      keep: number of most recent checkpoints kept on disk; None keeps all.
      async_save: write files in a background thread (training continues during the write).

    Examples:
      >>> from jaxrl_llm.config import build
      >>> build(CheckpointConfig, {"every": 50, "keep": 2})
      CheckpointConfig(every=50, keep=2, async_save=True)
      >>> CheckpointConfig(every=0)
      Traceback (most recent call last):
      ...
      ValueError: CheckpointConfig: `every` must be an int >= 1, got 0.
    """

    every: int = 100
    keep: int | None = 3
    async_save: bool = True

    def __post_init__(self) -> None:
        _check_positive_int("CheckpointConfig", "every", self.every)
        if self.keep is not None:
            _check_positive_int("CheckpointConfig", "keep", self.keep)
        if not isinstance(self.async_save, bool):
            raise ValueError(
                f"CheckpointConfig: `async_save` must be a bool, got {self.async_save!r}."
            )


def _check_positive_int(owner: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{owner}: `{name}` must be an int >= 1, got {value!r}.")


def _leaf_name(path: tuple[Any, ...]) -> str:
    """Dotted leaf name, as orbax names it (`params.policy.kernel.value`, `opt_state.0.mu...`)."""
    return jax.tree_util.keystr(path, simple=True, separator=".")


def _is_prng_key(dtype: Any) -> bool:
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def abstract_target(state: Any) -> Any:
    """The restore target of `state`: `jax.ShapeDtypeStruct(shape, dtype, sharding)` per leaf.

    `jax.Array` leaves contribute their own sharding; `jax.ShapeDtypeStruct` leaves must carry
    one (build them with `jax.eval_shape` under a mesh, or with `sharding=`). The sharding
    decides where each restored leaf lives, so a different mesh here reshards the checkpoint.

    Args:
      state: a pytree of `jax.Array` / `jax.ShapeDtypeStruct` leaves (e.g. a `TrainState`
        built by `init_train_state`, or its `jax.eval_shape`).

    Returns:
      The same pytree with `jax.ShapeDtypeStruct` leaves (typed PRNG keys keep their key dtype).

    Raises:
      ValueError: a leaf is neither kind, or a `ShapeDtypeStruct` has no sharding (the message
        names the leaf).

    Examples:
      >>> import jax.numpy as jnp
      >>> target = abstract_target({"w": jnp.zeros((2, 3)), "key": jax.random.key(0)})
      >>> target["w"].shape, target["key"].dtype
      ((2, 3), key<fry>)
    """
    return _abstract(state, "abstract_target")


def _abstract(state: Any, where: str) -> Any:
    def one(path: tuple[Any, ...], leaf: Any) -> jax.ShapeDtypeStruct:
        name = _leaf_name(path) or "<root>"
        if isinstance(leaf, jax.Array):
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
        if isinstance(leaf, jax.ShapeDtypeStruct):
            if leaf.sharding is None:
                raise ValueError(
                    f"{where}: leaf '{name}' is a jax.ShapeDtypeStruct without a "
                    "sharding; give it `sharding=` (e.g. a NamedSharding on the mesh) so the "
                    "restore knows where to place it."
                )
            return leaf
        raise ValueError(
            f"{where}: leaf '{name}' must be a jax.Array or jax.ShapeDtypeStruct, got "
            f"{type(leaf).__name__}."
        )

    return jax.tree_util.tree_map_with_path(one, state)


def _stored_layout(leaf: jax.ShapeDtypeStruct) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) as orbax stores the leaf: typed PRNG keys are stored as their key data."""
    if _is_prng_key(leaf.dtype):
        data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(leaf.shape, leaf.dtype))
        return tuple(data.shape), np.dtype(data.dtype)
    return tuple(leaf.shape), np.dtype(leaf.dtype)


def _listed(items: list[str]) -> str:
    shown = "; ".join(items[:_MAX_LISTED])
    more = len(items) - _MAX_LISTED
    return shown + (f"; ... and {more} more" if more > 0 else "")


def _without_absent_fields(target: Any, saved_tree: Any) -> tuple[Any, Any]:
    """`(target to restore, rebuild)`: for a NamedTuple target whose None fields the checkpoint
    does not hold (a field added to the state type after the checkpoint was written, and empty
    in this run: `TrainState.reward_moments`), the target as a dict of the saved fields, and
    the function that turns the restored dict back into the NamedTuple with those fields None.
    Any other target is restored as it is."""
    fields = getattr(type(target), "_fields", None)
    if fields is None or not isinstance(saved_tree, Mapping):
        return target, lambda restored: restored
    absent = [f for f in fields if f not in saved_tree and getattr(target, f) is None]
    if not absent:
        return target, lambda restored: restored
    kept = {f: getattr(target, f) for f in fields if f not in absent}
    return kept, lambda restored: type(target)(**restored, **dict.fromkeys(absent))


class StateMismatchError(ValueError):
    """A checkpoint's tree does not match the target state: `leaves` names every leaf that is
    missing on either side or has another shape or dtype (dotted paths, `opt_state.…`).

    Examples:
      >>> err = StateMismatchError("restore: does not match", frozenset({"opt_state.mu"}))
      >>> isinstance(err, ValueError), sorted(err.leaves)
      (True, ['opt_state.mu'])
    """

    def __init__(self, message: str, leaves: frozenset[str]):
        super().__init__(message)
        self.leaves = leaves


def _check_matches(saved_tree: Any, target: Any, *, where: str) -> None:
    """Raise `StateMismatchError` naming the first leaves whose names, shapes or dtypes differ."""
    saved: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    for path, meta in jax.tree_util.tree_flatten_with_path(saved_tree)[0]:
        saved[_leaf_name(path)] = (tuple(meta.shape), np.dtype(meta.dtype))
    wanted = {
        _leaf_name(path): _stored_layout(leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(target)[0]
    }
    problems = []
    missing = [name for name in wanted if name not in saved]
    extra = [name for name in saved if name not in wanted]
    if missing:
        problems.append(f"not in the checkpoint: {_listed(missing)}")
    if extra:
        problems.append(f"only in the checkpoint: {_listed(extra)}")
    mismatched = [
        name for name, layout in wanted.items() if name in saved and saved[name] != layout
    ]
    differ = [
        f"{name}: checkpoint {saved[name][0]} {saved[name][1]} vs target {shape} {dtype}"
        for name, (shape, dtype) in ((n, wanted[n]) for n in mismatched)
    ]
    if differ:
        problems.append(f"shape/dtype mismatch: {_listed(differ)}")
    if problems:
        raise StateMismatchError(
            f"Checkpointer.restore: {where} does not match the target state (a checkpoint of a "
            f"different model or config?) -- {' | '.join(problems)}.",
            frozenset([*missing, *extra, *mismatched]),
        )


def _checkable(dtype: Any) -> bool:
    """Whether a leaf's bits can be checksummed (typed keys, bool, 8/16/32/64-bit numbers)."""
    if _is_prng_key(dtype) or dtype == np.bool_:
        return True
    return (
        jax.dtypes.issubdtype(dtype, np.number)
        and not jax.dtypes.issubdtype(dtype, np.complexfloating)
        and jax.dtypes.itemsize_bits(dtype) in (8, 16, 32, 64)
    )


def _leaf_checksum(x: jax.Array) -> jax.Array:
    """`[Σ w, Σ mix(w)] mod 2³²` over the 32-bit words `w` of the leaf's bits (module docstring)."""
    if _is_prng_key(x.dtype):
        x = jax.random.key_data(x)
    if x.dtype == np.bool_:
        words = x.astype(np.uint32)
    else:
        unsigned = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint32}
        bits = jax.lax.bitcast_convert_type(x, unsigned[jax.dtypes.itemsize_bits(x.dtype)])
        words = bits.astype(np.uint32)  # 64-bit values: two words each (a trailing axis of 2)
    mixed = (words ^ (words >> 15)) * np.uint32(_MIX)
    return jax.numpy.stack(
        [jax.numpy.sum(words, dtype=np.uint32), jax.numpy.sum(mixed, dtype=np.uint32)]
    )


@jax.jit
def _checksum_leaves(leaves: list[jax.Array]) -> list[jax.Array]:
    return [_leaf_checksum(x) for x in leaves]


def _checksums(state: Any) -> dict[str, list[int]]:
    """`{leaf name: [sum, mixed sum]}` of every checkable leaf, computed on the devices."""
    named = [
        (_leaf_name(path), leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]
        if _checkable(leaf.dtype)
    ]
    sums = jax.device_get(_checksum_leaves([leaf for _, leaf in named]))
    return {name: [int(a), int(b)] for (name, _), (a, b) in zip(named, sums, strict=True)}


def _verify_checksums(restored: Any, saved: Mapping[str, Any], *, where: str, advice: str) -> None:
    """Raise `ValueError` naming the restored leaves whose checksums differ from the saved ones."""
    now = _checksums(restored)
    differ = [name for name, sums in saved.items() if name in now and now[name] != list(sums)]
    if differ:
        raise ValueError(
            f"Checkpointer.restore: {where} is corrupt: the restored values of "
            f"{_listed(differ)} differ from the saved ones (checksum mismatch: the files "
            f"changed on disk after the save); {advice}."
        )


def _silence_closed_loop_reports() -> None:
    """Drop the "Event loop is closed" reports of orbax reads that outlive a failed restore.

    When one read of a restore fails, the reads still in flight finish later and post their
    results to the event loop that orbax has already closed. Python reports each of those as
    an unraisable `RuntimeError` with a traceback on stderr, dozens of them, which would bury
    the one clear error `restore` raises. Installed before each restore reads (once per
    process, unless the hook was replaced since): the first of those reports can come before
    the failed read's exception reaches `restore`; the metadata reads that decide whether a step
    is complete install it too. Every other unraisable exception still reaches the previous
    hook.
    """
    previous = sys.unraisablehook
    if getattr(previous, "_drops_closed_loop_reports", False):
        return

    def hook(unraisable: Any) -> None:
        err = unraisable.exc_value
        if isinstance(err, RuntimeError) and str(err) == "Event loop is closed":
            return
        previous(unraisable)

    hook._drops_closed_loop_reports = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def _root_cause(err: BaseException) -> str:
    """The first line of the innermost cause of an exception (orbax wraps TensorStore errors)."""
    while err.__cause__ is not None:
        err = err.__cause__
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def _json_round_trip(meta: Any) -> dict[str, Any]:
    """`meta` if it survives JSON unchanged, else a ValueError naming the offending key."""
    if not isinstance(meta, Mapping):
        raise ValueError(f"Checkpointer: `meta` must be a mapping, got {type(meta).__name__}.")
    meta = dict(meta)
    for key, value in meta.items():
        if not isinstance(key, str):
            raise ValueError(f"Checkpointer: `meta` keys must be str, got {key!r}.")
        try:
            back = json.loads(json.dumps(value))
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"Checkpointer: `meta['{key}']` is not JSON-serialisable ({err}); convert it "
                "to dicts/lists/str/int/float/bool/None (e.g. IteratorState._asdict(), "
                "float(x) for arrays)."
            ) from None
        if not _same_json(back, value):
            raise ValueError(
                f"Checkpointer: `meta['{key}']` = {value!r} does not survive JSON unchanged "
                f"(it comes back as {back!r}); pass plain dicts and lists, e.g. "
                "IteratorState._asdict() instead of the NamedTuple."
            )
    return meta


def _same_json(back: Any, value: Any) -> bool:
    if type(back) is not type(value):
        return False
    if isinstance(value, dict):
        return back.keys() == value.keys() and all(_same_json(back[k], value[k]) for k in value)
    if isinstance(value, list):
        return len(back) == len(value) and all(map(_same_json, back, value))
    if isinstance(value, float) and math.isnan(value):
        return math.isnan(back)
    return back == value


class Checkpointer:
    """Periodic, atomic, optionally asynchronous orbax checkpoints of a train-state pytree.

    Args:
      directory: where step directories go (created if missing); in multi-host runs a
        filesystem that every process sees at the same path.
      save_every: `maybe_save(step, ...)` saves when `step % save_every == 0`.
      keep: number of most recent checkpoints kept; None keeps all.
      async_save: write in a background thread (see the module docstring).

    Raises:
      ValueError: a bad argument (named in the message).

    Examples:
      >>> import tempfile, jax.numpy as jnp
      >>> state = {"w": jnp.arange(3.0), "key": jax.random.key(0)}
      >>> with Checkpointer(tempfile.mkdtemp(), save_every=2, async_save=False) as ckpt:
      ...     ckpt.maybe_save(1, state, {"position": 1}), ckpt.maybe_save(2, state, {"position": 2})
      ...     restored, meta = ckpt.restore(target_state=state)
      (False, True)
      >>> ckpt.latest_step(), meta, restored["w"].tolist()
      (2, {'position': 2}, [0.0, 1.0, 2.0])
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        save_every: int,
        keep: int | None = 3,
        async_save: bool = True,
    ) -> None:
        if not isinstance(directory, str | os.PathLike) or not str(directory):
            raise ValueError(
                f"Checkpointer: `directory` must be a non-empty path, got {directory!r}."
            )
        _check_positive_int("Checkpointer", "save_every", save_every)
        if keep is not None:
            _check_positive_int("Checkpointer", "keep", keep)
        if not isinstance(async_save, bool):
            raise ValueError(f"Checkpointer: `async_save` must be a bool, got {async_save!r}.")
        self.directory = pathlib.Path(directory).absolute()
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"Checkpointer: `directory` {self.directory} is not a directory.")
        self.save_every = int(save_every)
        # Unfinished saves of earlier runs: reported now, removed by orbax on open.
        self._unfinished = self._scan_unfinished()
        for step, name in sorted(self._unfinished.items()):
            warnings.warn(
                f"Checkpointer: the save of step {step} in {self.directory} did not finish "
                f"(found {name}); it is ignored and will be removed.",
                IncompleteCheckpointWarning,
                stacklevel=2,
            )
        preservation = ocp.checkpoint_managers.LatestN(n=None if keep is None else int(keep))
        options = ocp.CheckpointManagerOptions(
            enable_async_checkpointing=async_save,
            preservation_policy=preservation,
            cleanup_tmp_directories=True,
            create=True,
        )
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=options,
            item_handlers={
                _STATE: ocp.StandardCheckpointHandler(),
                _META: ocp.JsonCheckpointHandler(),
                _CHECKSUMS: ocp.JsonCheckpointHandler(),
            },
        )

    @classmethod
    def from_config(
        cls, directory: str | os.PathLike[str], config: CheckpointConfig
    ) -> Checkpointer:
        """A `Checkpointer` with the settings of a `CheckpointConfig`.

        Examples:
          >>> import tempfile
          >>> ckpt = Checkpointer.from_config(tempfile.mkdtemp(), CheckpointConfig(every=5))
          >>> ckpt.save_every
          5
          >>> ckpt.close()
        """
        if not isinstance(config, CheckpointConfig):
            raise ValueError(
                f"Checkpointer.from_config: `config` must be a CheckpointConfig, got "
                f"{type(config).__name__}."
            )
        return cls(
            directory, save_every=config.every, keep=config.keep, async_save=config.async_save
        )

    def _scan_unfinished(self) -> dict[int, str]:
        if not self.directory.is_dir():
            return {}
        found = {}
        for entry in self.directory.iterdir():
            match = _TMP_STEP.match(entry.name)
            if match:
                found[int(match.group(1))] = entry.name
        return found

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def all_steps(self) -> list[int]:
        """Steps with a complete checkpoint on disk, ascending (a save in flight excluded).

        Examples:
          >>> import tempfile
          >>> with Checkpointer(tempfile.mkdtemp(), save_every=1) as ckpt:
          ...     ckpt.all_steps()
          []
        """
        return sorted(s for s in self._manager.all_steps() if self._is_complete(s))

    def unreadable_steps(self) -> list[int]:
        """Step directories that are not complete checkpoints (unreadable metadata or items).

        A save that did not finish never reaches its step directory (see the module docstring),
        so these are damaged after the fact; they are skipped by `restore`, with a warning.

        Examples:
          >>> import tempfile
          >>> with Checkpointer(tempfile.mkdtemp(), save_every=1) as ckpt:
          ...     ckpt.unreadable_steps()
          []
        """
        return sorted(s for s in self._manager.all_steps() if not self._is_complete(s))

    def _is_complete(self, step: int) -> bool:
        """Both items are present and readable through orbax's metadata API."""
        _silence_closed_loop_reports()  # a damaged step's metadata reads fail as a restore's do
        try:
            metadata = self._manager.item_metadata(step)
        except Exception:  # damaged metadata fails in many ways (a corrupt sharding record
            return False  # raises NotImplementedError): the step is not restorable as it is
        state = metadata.get(_STATE) if metadata is not None else None
        return state is not None and _META in metadata

    def latest_step(self) -> int | None:
        """The newest complete step, or None when there is none (a fresh run).

        Examples:
          >>> import tempfile
          >>> with Checkpointer(tempfile.mkdtemp(), save_every=1) as ckpt:
          ...     ckpt.latest_step() is None
          True
        """
        return next(self._complete_newest_first(), None)

    def _complete_newest_first(self) -> Iterator[int]:
        """Complete steps, newest first (reads metadata only as far as the caller iterates)."""
        return (s for s in sorted(self._manager.all_steps(), reverse=True) if self._is_complete(s))

    def maybe_save(self, step: int, state: Any, meta: Mapping[str, Any]) -> bool:
        """Save when `step % save_every == 0` (and the step is not saved yet).

        Args:
          step: the update step this state is *after* (the loop's step counter).
          state: the train-state pytree (`jax.Array` leaves, typed PRNG keys allowed).
          meta: JSON-serialisable mapping stored next to it (returned by `restore`).

        Returns:
          Whether a save was started.

        Raises:
          ValueError: `step` is not an int >= 0, or `meta` does not survive JSON unchanged.

        Examples:
          >>> import tempfile, jax.numpy as jnp
          >>> with Checkpointer(tempfile.mkdtemp(), save_every=10) as ckpt:
          ...     [ckpt.maybe_save(s, {"x": jnp.ones(2)}, {}) for s in (5, 10, 10)]
          [False, True, False]
        """
        step = self._check_step(step, "maybe_save")
        if step % self.save_every:
            return False
        return self.save(step, state, meta)

    def save(self, step: int, state: Any, meta: Mapping[str, Any]) -> bool:
        """Save now, whatever `save_every` says (the final checkpoint of a run).

        The call returns when the arrays are off the devices (async) or on disk (sync).
        Saving a step that already has a complete checkpoint is a no-op returning False (e.g.
        the last step was also a periodic step); an incomplete one is replaced, with an
        `IncompleteCheckpointWarning`.

        Args:
          step: the update step (int >= 0).
          state: the train-state pytree.
          meta: JSON-serialisable mapping stored next to it.

        Returns:
          Whether a save was started.

        Examples:
          >>> import tempfile, jax.numpy as jnp
          >>> with Checkpointer(tempfile.mkdtemp(), save_every=100) as ckpt:
          ...     started = ckpt.save(7, {"x": jnp.ones(2)}, {"done": True})
          ...     ckpt.wait()  # an asynchronous save counts once it is on disk
          ...     started, ckpt.latest_step()
          (True, 7)
        """
        step = self._check_step(step, "save")
        meta = _json_round_trip(meta)
        _abstract(state, "Checkpointer.save")  # every leaf an array (clear error otherwise)
        if step in self._manager.all_steps():
            self._manager.wait_until_finished()  # it may be this step's own save in flight
            if self._is_complete(step):
                return False
            warnings.warn(
                f"Checkpointer.save: step {step} in {self.directory} is incomplete (unreadable); "
                "replacing it.",
                IncompleteCheckpointWarning,
                stacklevel=2,
            )
            self._manager.delete(step)
        args = ocp.args.Composite(
            **{
                _STATE: ocp.args.StandardSave(state),
                _META: ocp.args.JsonSave(meta),
                _CHECKSUMS: ocp.args.JsonSave(_checksums(state)),
            }
        )
        try:
            return bool(self._manager.save(step, args=args, force=True))
        except ocp.checkpoint_manager.StepAlreadyExistsError:
            return False

    @staticmethod
    def _check_step(step: Any, method: str) -> int:
        if isinstance(step, bool) or not isinstance(step, int | np.integer) or step < 0:
            raise ValueError(f"Checkpointer.{method}: `step` must be an int >= 0, got {step!r}.")
        return int(step)

    def restore(self, step: int | None = None, *, target_state: Any) -> tuple[Any, dict[str, Any]]:
        """Read a checkpoint onto the shardings of `target_state`.

        Args:
          step: the step to read; None reads the newest complete one (a newer save that did
            not finish is skipped with an `IncompleteCheckpointWarning`).
          target_state: a pytree like the saved state, with `jax.Array` leaves (e.g. a freshly
            initialised state) or `jax.ShapeDtypeStruct(..., sharding=...)` leaves (e.g.
            `jax.eval_shape` of the initialiser under the mesh). Its tree structure is the
            structure of the result (NamedTuples, `nnx.State`, ...), its shardings are where
            the leaves land.

        Returns:
          `(state, meta)`: the restored state (bit-for-bit the saved values) and the JSON meta.

        Raises:
          ValueError: no complete checkpoint (or not the requested step), the checkpoint does
            not match the target (`StateMismatchError`: names, shapes, dtypes; the message
            lists the first ones, `.leaves` all of them), its
            files cannot be read (truncated, missing), or the restored values differ from the
            saved ones (checksums; the message names the leaves).

        Examples:
          >>> import tempfile, jax.numpy as jnp
          >>> with Checkpointer(tempfile.mkdtemp(), save_every=1, async_save=False) as ckpt:
          ...     _ = ckpt.save(3, {"w": jnp.ones((2, 2))}, {})
          ...     ckpt.restore(target_state={"w": jnp.zeros((3, 2))})
          Traceback (most recent call last):
          ...
          jaxrl_llm.checkpoint.StateMismatchError: Checkpointer.restore: step 3 ... shape/dtype mismatch: w: checkpoint (2, 2) float32 vs target (3, 2) float32.
        """
        target = _abstract(target_state, "Checkpointer.restore")
        self._manager.wait_until_finished()
        if step is None:
            step = self._latest_for_restore()
        else:
            step = self._check_step(step, "restore")
            if step not in self._manager.all_steps() or not self._is_complete(step):
                raise ValueError(
                    f"Checkpointer.restore: `step` {step} has no complete checkpoint in "
                    f"{self.directory}; complete steps: {self.all_steps() or 'none'}."
                )
        where = f"step {step} in {self.directory}"
        saved = self._manager.item_metadata(step)[_STATE]
        _check_matches(saved.tree, target, where=where)
        target, rebuild = _without_absent_fields(target, saved.tree)
        items = {_STATE: ocp.args.StandardRestore(target), _META: ocp.args.JsonRestore()}
        checked = (self.directory / str(step) / _CHECKSUMS).is_dir()  # absent: older checkpoints
        if checked:
            items[_CHECKSUMS] = ocp.args.JsonRestore()
        _silence_closed_loop_reports()
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as err:  # any failure to read the files: name the step and the cause
            raise ValueError(
                f"Checkpointer.restore: {where} is unreadable (corrupt or truncated files: "
                f"{_root_cause(err)}); {self._fallback_advice(step)}."
            ) from err
        state = rebuild(restored[_STATE])
        if checked:
            _verify_checksums(
                state, restored[_CHECKSUMS], where=where, advice=self._fallback_advice(step)
            )
        return state, dict(restored[_META])

    def _fallback_advice(self, step: int) -> str:
        older = [s for s in self.all_steps() if s < step]
        if not older:
            return "there is no older complete step to fall back to"
        return f"move {self.directory / str(step)} away to restore step {older[-1]} instead"

    def _latest_for_restore(self) -> int:
        """The newest complete step; warns about newer incomplete ones (once per instance)."""
        latest = self.latest_step()
        if latest is None:
            notes = []
            if self._unfinished:
                notes.append(f"unfinished saves of steps {sorted(self._unfinished)} are ignored")
            unreadable = self.unreadable_steps()
            if unreadable:
                notes.append(f"step(s) {unreadable} cannot be read (damaged files)")
            raise ValueError(
                f"Checkpointer.restore: no complete checkpoint in {self.directory}"
                + (f" ({'; '.join(notes)})" if notes else "")
                + "."
            )
        skipped = {s for s in self._unfinished if s > latest}
        skipped |= {s for s in self._manager.all_steps() if s > latest}
        if skipped:
            warnings.warn(
                f"Checkpointer.restore: skipping step(s) {sorted(skipped)} in {self.directory}, "
                f"whose save did not finish or is unreadable; restoring step {latest}.",
                IncompleteCheckpointWarning,
                stacklevel=3,
            )
            self._unfinished = {}  # reported once; orbax removed their directories
        return latest

    def wait(self) -> None:
        """Block until the last (asynchronous) save is on disk.

        Examples:
          >>> import tempfile
          >>> with Checkpointer(tempfile.mkdtemp(), save_every=1) as ckpt:
          ...     ckpt.wait()
        """
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Finish pending saves and release orbax's threads (also done by `with`).

        Examples:
          >>> import tempfile
          >>> Checkpointer(tempfile.mkdtemp(), save_every=1).close()
        """
        self._manager.close()
