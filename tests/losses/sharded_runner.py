"""Run every `ShardCase` of `tests/losses/sharded_cases_*.py` on 8 simulated CPU devices.

Executed in a subprocess by `test_sharded.py` with
`XLA_FLAGS=--xla_force_host_platform_device_count=8`: each case runs under `jax.jit` on
single-device inputs and on inputs sharded along their leading axis over a mesh axis `data` of
size 8, and the two results (values, metrics and `jax.grad` w.r.t. the first argument when that
is a float array) must agree to 1e-5. The cases of one file run as one jitted program per
placement (compiling 2 programs per file instead of up to 4 per case); a file whose program
fails to trace or compile is re-run case by case to name the failing case. Prints one line per
case and exits 1 on a mismatch.

Run a subset by naming case files (stems after `sharded_cases_`) as arguments, e.g.
`XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m tests.losses.sharded_runner kl`.
"""

from __future__ import annotations

import importlib
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec


def _load_case_files(only: list[str]) -> list[tuple[str, list]]:
    here = pathlib.Path(__file__).parent
    paths = sorted(here.glob("sharded_cases_*.py"))
    if only:
        paths = [p for p in paths if p.stem.removeprefix("sharded_cases_") in only]
        if not paths:
            raise SystemExit(f"no tests/losses/sharded_cases_<name>.py for {only}")
    return [
        (path.stem, importlib.import_module(f"tests.losses.{path.stem}").CASES) for path in paths
    ]


def _place(args: tuple, sharding: NamedSharding | None) -> list:
    out = []
    for a in args:
        if a is None or np.ndim(a) == 0:
            out.append(a)
        elif sharding is None:
            out.append(jnp.asarray(a))
        else:
            if np.shape(a)[0] % 8:
                raise ValueError(f"leading axis of shape {np.shape(a)} is not a multiple of 8")
            spec = PartitionSpec("data", *([None] * (np.ndim(a) - 1)))
            out.append(jax.device_put(jnp.asarray(a), NamedSharding(sharding.mesh, spec)))
    return out


def _case_outputs(case, args: list) -> dict:
    """The case's value (and `jax.grad` w.r.t. its first argument when that is a float array:
    of the loss when the function returns `(loss, metrics)`, else of the sum of its output)."""
    out = {"value": case.fn(*args, **case.kwargs)}
    if np.issubdtype(np.asarray(case.args[0]).dtype, np.floating):

        def scalar(x0):
            value = case.fn(x0, *args[1:], **case.kwargs)
            return value[0] if isinstance(value, tuple) else jnp.sum(value)

        out["grad"] = jax.grad(scalar)(args[0])
    return out


def _outputs(cases: list, sharding: NamedSharding | None, mesh) -> list[dict]:
    """Every case's outputs from one jitted program (one compilation per case file and
    placement: compilation, not execution, is what costs here)."""

    @jax.jit
    def run(all_args):
        return [_case_outputs(case, args) for case, args in zip(cases, all_args, strict=True)]

    placed = [_place(case.args, sharding) for case in cases]
    if sharding is None:
        return run(placed)
    with jax.set_mesh(mesh):
        return run(placed)


def _compare(single: dict, sharded: dict) -> None:
    for s, p in zip(jax.tree.leaves(single), jax.tree.leaves(sharded), strict=True):
        np.testing.assert_allclose(
            np.asarray(p, np.float64), np.asarray(s, np.float64), rtol=1e-5, atol=1e-6
        )


def _check(cases: list, sharding: NamedSharding, mesh) -> list[str | None]:
    """Per case: None when the single-device and sharded results agree, else the error."""
    try:
        pairs = zip(_outputs(cases, None, mesh), _outputs(cases, sharding, mesh), strict=True)
    except Exception:  # a case that does not trace or compile: find it, one case at a time
        if len(cases) == 1:
            raise
        return [error for case in cases for error in _check([case], sharding, mesh)]
    errors = []
    for single, sharded in pairs:
        try:
            _compare(single, sharded)
            errors.append(None)
        except Exception as err:
            errors.append(f"{type(err).__name__}: {err}")
    return errors


def main(only: list[str]) -> int:
    assert jax.device_count() == 8, f"expected 8 devices, got {jax.device_count()}"
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    total = failures = 0
    for _, cases in _load_case_files(only):
        try:
            errors = _check(cases, sharding, mesh)
        except Exception as err:  # one case alone fails to run
            errors = [f"{type(err).__name__}: {err}"]
        for case, error in zip(cases, errors, strict=False):
            total += 1
            if error is None:
                print(f"ok   {case.name}")
            else:
                failures += 1
                print(f"FAIL {case.name}: {error}")
    print(f"{total - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
