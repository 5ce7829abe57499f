"""Benchmarks of `losses` on this machine: steady-state time and compiled temporary memory.

Run with `make bench` (or `python -m benchmarks.bench_losses --out FILE.json`). Never part of the
test suite's pass/fail. Each case is jitted, warmed up once, then timed as the median of `--repeat`
runs (blocking on the result); the compiled program's temporary buffer size comes from XLA's
memory analysis, which is what shows the effect of vocabulary chunking.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import losses


def _time(fn: Callable, args: tuple, repeat: int) -> tuple[float, float, int]:
    compiled = jax.jit(fn).lower(*args).compile()
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    first = time.perf_counter() - start
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    memory = compiled.memory_analysis()
    temp = int(getattr(memory, "temp_size_in_bytes", 0)) if memory is not None else 0
    return statistics.median(times), first, temp


def cases(rng: np.random.Generator) -> list[tuple[str, Callable, tuple, int]]:
    """(name, function, args, tokens processed per call)."""
    N, T, V = 16, 256, 32768
    logits = jnp.asarray(rng.normal(size=(N, T, V)).astype(np.float32))
    targets = jnp.asarray(rng.integers(0, V, size=(N, T)))
    n2, t2 = 256, 1024
    logp = jnp.asarray(-rng.uniform(0.1, 3, size=(n2, t2)).astype(np.float32))
    old = logp + 0.1 * jnp.asarray(rng.normal(size=(n2, t2)).astype(np.float32))
    adv = jnp.asarray(rng.normal(size=(n2, t2)).astype(np.float32))
    mask = jnp.asarray((rng.uniform(size=(n2, t2)) < 0.9).astype(np.float32))
    values = jnp.asarray(rng.normal(size=(n2, t2)).astype(np.float32))
    rewards = jnp.asarray(rng.normal(size=(n2 // 8, 8)).astype(np.float32))

    def logp_grad(chunk):
        def f(z, y):
            return jax.grad(lambda z: jnp.sum(losses.token_logprobs(z, y, chunk_size=chunk)))(z)

        return f

    def loss_grad(fn, **kw):
        def f(lp, o, a, m):
            return jax.grad(lambda lp: fn(lp, o, a, m, **kw)[0])(lp)

        return f

    return [
        (
            "token_logprobs fwd, unchunked [16,256,32768]",
            lambda z, y: losses.token_logprobs(z, y),
            (logits, targets),
            N * T,
        ),
        (
            "token_logprobs fwd, chunk 512 rows",
            lambda z, y: losses.token_logprobs(z, y, chunk_size=512),
            (logits, targets),
            N * T,
        ),
        ("token_logprobs grad, unchunked", logp_grad(None), (logits, targets), N * T),
        ("token_logprobs grad, chunk 512 rows", logp_grad(512), (logits, targets), N * T),
        (
            "entropy_from_logits fwd, chunk 512 rows",
            lambda z: losses.entropy_from_logits(z, chunk_size=512),
            (logits,),
            N * T,
        ),
        (
            "ppo_clip_loss grad [256,1024]",
            loss_grad(losses.ppo_clip_loss, dual_clip=3.0),
            (logp, old, adv, mask),
            n2 * t2,
        ),
        ("gspo_loss grad [256,1024]", loss_grad(losses.gspo_loss), (logp, old, adv, mask), n2 * t2),
        (
            "kl_cov_loss grad [256,1024]",
            loss_grad(losses.kl_cov_loss),
            (logp, old, adv, mask),
            n2 * t2,
        ),
        (
            "gae [256,1024] (reverse scan)",
            lambda r, v, m: losses.gae(r, v, m, gamma=1.0, lam=0.95),
            (adv, values, mask),
            n2 * t2,
        ),
        ("group_advantages [32,8]", lambda r: losses.group_advantages(r), (rewards,), n2),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=None, help="write results as JSON")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    device = jax.devices()[0]
    results = []
    print(
        f"jax {jax.__version__} on {device.platform} ({device.device_kind}), "
        f"{platform.processor() or platform.machine()}"
    )
    print(f"{'case':<48}{'median ms':>11}{'first ms':>10}{'Mtok/s':>9}{'temp MiB':>10}")
    for name, fn, fn_args, tokens in cases(rng):
        median, first, temp = _time(fn, fn_args, args.repeat)
        row = {
            "case": name,
            "median_s": median,
            "first_call_s": first,
            "tokens_per_s": tokens / median,
            "temp_bytes": temp,
        }
        results.append(row)
        print(
            f"{name:<48}{1e3 * median:>11.2f}{1e3 * first:>10.1f}"
            f"{tokens / median / 1e6:>9.2f}{temp / 2**20:>10.1f}"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"jax": jax.__version__, "device": device.device_kind, "results": results}
        args.out.write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
