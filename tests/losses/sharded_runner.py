"""Run every `ShardCase` of `tests/losses/sharded_cases_*.py` on 8 simulated CPU devices.

Executed in a subprocess by `test_sharded.py` with
`XLA_FLAGS=--xla_force_host_platform_device_count=8`: each case runs under `jax.jit` on
single-device inputs and on inputs sharded along their leading axis over a mesh axis `data` of
size 8, and the two results (values, metrics and `jax.grad` w.r.t. the first argument when the
function returns a loss) must agree to 1e-5. Prints one line per case and exits 1 on a mismatch.

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


def _load_cases(only: list[str]) -> list:
    here = pathlib.Path(__file__).parent
    paths = sorted(here.glob("sharded_cases_*.py"))
    if only:
        paths = [p for p in paths if p.stem.removeprefix("sharded_cases_") in only]
        if not paths:
            raise SystemExit(f"no tests/losses/sharded_cases_<name>.py for {only}")
    cases = []
    for path in paths:
        module = importlib.import_module(f"tests.losses.{path.stem}")
        cases.extend(module.CASES)
    return cases


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


def main(only: list[str]) -> int:
    assert jax.device_count() == 8, f"expected 8 devices, got {jax.device_count()}"
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    failures = 0
    cases = _load_cases(only)
    for case in cases:

        def run(*a, _case=case):
            return _case.fn(*a, **_case.kwargs)

        def first_grad(*a, _run=run):
            def scalar(x0):
                out = _run(x0, *a[1:])
                return out[0] if isinstance(out, tuple) else jnp.sum(out)

            return jax.grad(scalar)(a[0])

        fns = [jax.jit(run)]
        if np.issubdtype(np.asarray(case.args[0]).dtype, np.floating):
            fns.append(jax.jit(first_grad))
        try:
            for fn in fns:
                single = fn(*_place(case.args, None))
                with jax.set_mesh(mesh):
                    sharded = fn(*_place(case.args, sharding))
                for s, p in zip(jax.tree.leaves(single), jax.tree.leaves(sharded), strict=True):
                    np.testing.assert_allclose(
                        np.asarray(p, np.float64), np.asarray(s, np.float64), rtol=1e-5, atol=1e-6
                    )
            print(f"ok   {case.name}")
        except Exception as err:  # report every failing case, then fail
            failures += 1
            print(f"FAIL {case.name}: {type(err).__name__}: {err}")
    print(f"{len(cases) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
