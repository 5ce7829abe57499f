"""Every public `losses` function rejects a wrong rank and a mismatched mask at trace time.

The valid inputs come from each function's own documented example: its doctest is executed up
to the first call of the function, and that call's arguments are recorded as shapes and dtypes
(`jax.ShapeDtypeStruct`). Each array argument is then mutated, one at a time, and the function
is traced (`jax.eval_shape`: nothing is computed, so any error is a trace-time error):

    rank    the argument gets one more trailing axis of size 1
    shape   a mask argument (its name contains "mask") gets one more entry on its last axis

Either mutation must raise a `ValueError` whose message names the mutated argument (in
backticks, as `losses._checks` writes it) and shows the shape it received. Mutations that are
valid inputs by design are listed in `ACCEPTED` with the reason; a listed mutation that starts
raising fails the test too, so the list stays exact.
"""

from __future__ import annotations

import doctest
import functools
import inspect
import sys

import jax
import numpy as np
import pytest

import losses

FUNCTIONS = sorted(n for n in losses.__all__ if inspect.isfunction(getattr(losses, n)))

# functions whose documented call has no array argument of rank >= 1 (only scalars / states)
NO_ARRAY_ARGUMENTS = {
    "adaptive_kl_controller": "hyperparameters only (returns a KLController)",
    "adaptive_kl_update": "a scalar KL and a controller state",
    "clip_bound_grid": "scalar bounds and a static grid size",
    "dual_ascent_update": "a scalar multiplier and a scalar constraint value",
    "fixed_kl_controller": "hyperparameters only (returns a KLController)",
    "init_beta_tracker": "a static number of prompts and scalar priors",
    "init_running_moments": "no arguments",
}

# (function, argument, mutation) -> why the mutated input is valid
ACCEPTED = {
    ("broadcast_to_tokens", "values", "rank"): "`values` is [N] or [B,G]; [N,1] is [B,G], G = 1",
    ("broadcast_to_tokens", "mask", "shape"): "`mask` defines [N,T]; any T is valid",
    ("dual_level_advantages", "episode_adv", "rank"): "[N] or [B,G]; [N,1] is [B,G], G = 1",
    ("from_groups", "x", "rank"): "any [B,G,...] of rank >= 2",
    ("keep_groups_mask", "mask", "rank"): "`mask` is [N, ...] of any rank",
    ("keep_groups_mask", "mask", "shape"): "`mask` is [N, ...] of any shape",
    ("mask_truncated", "mask", "shape"): "`mask` defines [N,T]; any T is valid",
    ("masked_count", "mask", "rank"): "counts a mask of any shape",
    ("masked_count", "mask", "shape"): "counts a mask of any shape",
    ("normalize_rewards", "x", "rank"): "elementwise on rewards of any shape",
    ("off_policy_sequence_mask", "advantages", "rank"): "[N], [N,1] or [N,T] by design",
    ("overlong_penalty", "lengths", "rank"): "elementwise on lengths of any shape",
    ("par_rewards", "ref_scores", "rank"): "[R] or [N,R]: the example's [2] → [2,1] is [N,R]",
    ("pass_at_k", "c", "rank"): "`c` and `n` broadcast against each other by design",
    ("reinforce_pp_baseline_advantages", "mask", "shape"): "`mask` defines T; any T is valid",
    ("running_moments_update", "x", "rank"): "merges a batch of any shape",
    ("sign_weighted_advantages", "advantages", "rank"): "pointwise on advantages of any shape",
    ("to_groups", "x", "rank"): "any [N, ...]: only the leading axis is split",
}


class _RecordedError(Exception):
    """Raised by the recording stand-in to stop the example at the function's first call."""


def _abstract(value):
    if isinstance(value, jax.Array | np.ndarray):  # tracers (calls under jit) are jax.Arrays
        return jax.ShapeDtypeStruct(np.shape(value), value.dtype)
    return value


@functools.cache
def documented_call(name):
    """`(signature, arguments)` of the first call of `losses.<name>` in its doctest examples,
    with every array replaced by its `jax.ShapeDtypeStruct` (None if no example calls it)."""
    fn = getattr(losses, name)
    module = sys.modules[fn.__module__]
    recorded = []

    def record(*args, **kwargs):
        recorded.append(jax.tree.map(_abstract, (args, kwargs)))
        raise _RecordedError

    finder = doctest.DocTestFinder(recurse=False)
    saved = getattr(module, name)
    setattr(module, name, record)  # examples may reach it through the module or the package
    setattr(losses, name, record)
    try:
        for test in finder.find(fn, name, globs=dict(module.__dict__)):
            test.globs[name] = record
            for example in test.examples:
                try:
                    exec(compile(example.source, f"<{name} example>", "single"), test.globs)
                except _RecordedError:
                    break
                except Exception:  # a setup line that needs the real function's output
                    continue
            if recorded:
                break
    finally:
        setattr(module, name, saved)
        setattr(losses, name, fn)
    if not recorded:
        return None
    args, kwargs = recorded[0]
    signature = inspect.signature(fn)
    return signature, dict(signature.bind(*args, **kwargs).arguments)


def _holds_arrays(value):
    return any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(value))


def _trace(name, signature, arguments):
    """Trace the function on the (abstract) arguments; the error it raises, or None."""
    fn = getattr(losses, name)
    arrays = {k: v for k, v in arguments.items() if _holds_arrays(v)}
    static = {k: v for k, v in arguments.items() if k not in arrays}

    def call(arrays):
        bound = signature.bind_partial()
        merged = {**static, **arrays}
        bound.arguments.update({p: merged[p] for p in signature.parameters if p in merged})
        fn(*bound.args, **bound.kwargs)  # only the errors matter (outputs may be functions)

    try:
        jax.eval_shape(call, arrays)
    except Exception as err:
        return err
    return None


def _mutations(argument, value):
    yield "rank", jax.ShapeDtypeStruct((*value.shape, 1), value.dtype)
    if "mask" in argument:
        shape = (*value.shape[:-1], value.shape[-1] + 1)
        yield "shape", jax.ShapeDtypeStruct(shape, value.dtype)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_wrong_rank_and_mismatched_mask_raise_value_errors_naming_the_argument(name):
    call = documented_call(name)
    assert call is not None, f"no doctest example of losses.{name} calls it"
    signature, arguments = call
    assert _trace(name, signature, arguments) is None, "the documented call itself fails"
    mutable = {
        k: v for k, v in arguments.items() if isinstance(v, jax.ShapeDtypeStruct) and v.ndim >= 1
    }
    if name in NO_ARRAY_ARGUMENTS:
        assert not mutable, f"{name} takes arrays now: remove it from NO_ARRAY_ARGUMENTS"
        return
    assert mutable, f"the documented call of {name} passes no array of rank >= 1"
    problems = []
    for argument, value in mutable.items():
        for kind, bad in _mutations(argument, value):
            err = _trace(name, signature, {**arguments, argument: bad})
            accepted = (name, argument, kind) in ACCEPTED
            if accepted:
                if err is not None:
                    problems.append(f"{argument} ({kind}): listed in ACCEPTED but raises {err!r}")
                continue
            if not isinstance(err, ValueError):
                problems.append(
                    f"{argument} ({kind}) {bad.shape}: expected ValueError, got {err!r}"
                )
            elif f"`{argument}`" not in str(err) or str(bad.shape) not in str(err):
                problems.append(f"{argument} ({kind}): the message does not name it: {err}")
    assert not problems, "\n".join(problems)


def test_the_accepted_list_names_real_arguments():
    for name, argument, kind in ACCEPTED:
        assert name in FUNCTIONS and kind in ("rank", "shape")
        assert argument in inspect.signature(getattr(losses, name)).parameters
