"""Run by `test_crash.py`: save step 1, start an asynchronous save of step 2, wait to be killed.

The state is large enough (64 MiB) that writing it takes a while after `save` returns, so the
parent's SIGKILL lands in the middle of step 2's write. Prints `DIGEST <step> <sha256>` for each
state before saving it and `STARTED 2` once the asynchronous save is under way (its temporary
directory exists).
"""

from __future__ import annotations

import hashlib
import pathlib
import sys
import time

import jax
import jax.numpy as jnp

from jaxrl_llm.checkpoint import Checkpointer
from tests.checkpoint.helpers import leaf_bytes

ROWS, COLS = 4096, 4096  # float32: 64 MiB


def state_at(step: int) -> dict[str, jax.Array]:
    key = jax.random.key(step)
    return {
        "w": jax.random.normal(key, (ROWS, COLS), jnp.float32),
        "step": jnp.int32(step),
        "key": jax.random.fold_in(key, 1),
    }


def digest(state) -> str:
    hasher = hashlib.sha256()
    for leaf in jax.tree.leaves(state):
        for part in leaf_bytes(leaf):
            hasher.update(repr(part).encode() if not isinstance(part, bytes) else part)
    return hasher.hexdigest()


def main() -> None:
    directory = sys.argv[1]
    ckpt = Checkpointer(directory, save_every=1, async_save=True)
    first = state_at(1)
    print(f"DIGEST 1 {digest(first)}", flush=True)
    ckpt.save(1, first, {"step": 1})
    ckpt.wait()
    second = state_at(2)
    print(f"DIGEST 2 {digest(second)}", flush=True)
    ckpt.save(2, second, {"step": 2})
    # orbax may create the step's temporary directory after `save` returns: announce the
    # write only once it is on disk, so that the kill lands inside it (at most 10 s)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(
        p.name.startswith("2.orbax-checkpoint-tmp") for p in pathlib.Path(directory).iterdir()
    ):
        time.sleep(0.001)
    print("STARTED 2", flush=True)
    time.sleep(120)  # the parent kills us long before this


if __name__ == "__main__":
    main()
