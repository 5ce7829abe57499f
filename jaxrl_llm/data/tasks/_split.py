"""Seeded, disjoint train/eval splits of a procedural task.

Each problem is assigned to a split by a keyed hash of its prompt text:

    split(prompt) = "eval"  if  blake2b(seed ‖ prompt) / 2⁶⁴ < eval_fraction  else "train"

so the same prompt is never in both splits, whatever is drawn, and the assignment depends only
on the seed. Examples are then drawn from a seeded NumPy generator (one stream per split) and
kept when they fall in the requested split; eval examples are also kept unique.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

Split = Literal["train", "eval"]
Example = dict[str, Any]


def in_eval_split(prompt: str, *, seed: int, eval_fraction: float) -> bool:
    """Whether the problem `prompt` belongs to the eval split under `seed`.

    Examples:
      >>> [in_eval_split(p, seed=0, eval_fraction=0.5) for p in ("1+1=", "1+2=", "2+2=")]
      [False, False, True]
    """
    digest = hashlib.blake2b(f"{seed}\x00{prompt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 < eval_fraction


def sample_split(
    draw: Callable[[np.random.Generator], Example],
    *,
    split: Split,
    size: int,
    seed: int,
    eval_fraction: float,
    where: str,
) -> list[Example]:
    """`size` examples of `split`, drawn with `draw(rng)` and filtered by `in_eval_split`.

    Train examples may repeat (they follow the task's distribution); eval examples are
    distinct. Raises `ValueError` when the problem space is too small to fill the split.

    Examples:
      >>> draw = lambda rng: {"prompt": f"{int(rng.integers(10))}+1=", "answer": ""}
      >>> ev = sample_split(draw, split="eval", size=3, seed=0, eval_fraction=0.5, where="demo")
      >>> sorted(e["prompt"] for e in ev)
      ['2+1=', '3+1=', '9+1=']
    """
    if split not in ("train", "eval"):
        raise ValueError(f"{where}: `split` must be 'train' or 'eval', got {split!r}.")
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"{where}: `eval_fraction` must be in (0, 1), got {eval_fraction!r}.")
    rng = np.random.default_rng([seed, 0 if split == "train" else 1])
    want_eval = split == "eval"
    out: list[Example] = []
    seen: set[str] = set()
    # a split holds a share of the problems: about size / share draws fill it, 200× that (and
    # 1000 more) before the space is called too small (eval examples must also be distinct)
    share = eval_fraction if want_eval else 1.0 - eval_fraction
    budget = 1000 + math.ceil(200 * size / share)
    for _ in range(budget):
        if len(out) == size:
            return out
        example = draw(rng)
        prompt = example["prompt"]
        if in_eval_split(prompt, seed=seed, eval_fraction=eval_fraction) != want_eval:
            continue
        if want_eval and prompt in seen:
            continue
        seen.add(prompt)
        out.append(example)
    if len(out) == size:
        return out
    raise ValueError(
        f"{where}: found only {len(out)} of the {size} {split} examples asked for in {budget} "
        f"draws, 200 times the draws a split of {share:.3g} of the problems needs; the problem "
        f"space is too small for this split (eval_fraction={eval_fraction}): "
        f"lower `{split}_size`, change `eval_fraction`, or allow larger problems."
    )
