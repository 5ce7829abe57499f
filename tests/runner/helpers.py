"""Tiny runs for the runner tests: overrides that shrink any `configs/<name>.yaml`, and rewards.

Every run of these tests uses the same architecture, prompt / completion lengths and sampler
settings, so the compiled sampler, log-prob and evaluation programs are shared by all runs of
the session (`jaxrl_llm.runner.programs` caches them); each algorithm compiles only its own
update step.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
RL_CONFIGS = (
    "cispo",
    "dapo",
    "dr_grpo",
    "grpo",
    "gspo",
    "online_dpo",
    "ppo",
    "ppo_value_head_adaptive_kl",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "rloo",
    "sapo",
)
TINY_MODEL = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_layers": 1,
    "num_heads": 2,
    "num_kv_heads": 1,
    "head_dim": 8,
}

# a 1-layer width-16 model, 1-digit sums, 2 prompts × 2 samples of 4 tokens, 2 steps
TINY = [
    *(f"model.init.{k}={v}" for k, v in TINY_MODEL.items()),
    "data.arithmetic.max_digits=1",
    "data.arithmetic.train_size=32",
    "data.arithmetic.eval_size=4",
    "rewards.jax_native=false",
    "rewards.functions=[{fn: 'tests.runner.helpers:checksum_reward'}]",
    "sampling.max_new_tokens=4",
    "sampling.num_samples=2",
    "train.steps=2",
    "train.prompts_per_step=2",
    "train.eval_every=0",
    "train.eval_prompts=2",
    "train.eval_pass_k=[1, 2]",
    "warm_start=null",
    # SGD with momentum compiles much faster than AdamW's chain and still has optimizer state
    "optim.name=sgd",
    "optim.momentum=0.9",
    "optim.learning_rate=0.05",
    "optim.weight_decay=0.0",
    "optim.warmup_steps=0",
    "checkpoint.every=2",
    "checkpoint.async_save=false",
    "metrics.tensorboard=false",
    "metrics.console=false",
]
# the warm start and the SFT run share one compiled SFT step (same optimizer and batch shapes)
SFT_OPTIM = [
    "optim.name=adamw",
    "optim.momentum=null",
    "optim.learning_rate=1e-2",
    "optim.schedule=constant",
    "optim.warmup_steps=0",
    "optim.total_steps=null",
    "optim.final_lr_ratio=0.0",
    "optim.weight_decay=0.0",
]

PREFERENCE = [  # the model, data and run length of a preference config's run (configs/dpo.yaml)
    "model.init={family: qwen3, vocab_size: 259, hidden_size: 16, intermediate_size: 32, "
    "num_layers: 1, num_heads: 2, num_kv_heads: 1, head_dim: 8}",
    *(o for o in TINY if not o.startswith("model.")),
    "optim.total_steps=null",
    "optim.schedule=constant",
    "preference_data.bucket_minimum=4",
]


def checksum_reward(prompts, completions, **fields):
    """A reward that differs between almost any two completions: byte sum mod 7, in [0, 1]."""
    return [(sum(c.encode("utf-8", "surrogatepass")) % 7) / 6.0 for c in completions]


def length_reward(prompts, completions, completion_lengths, **fields):
    """A reward of the completion's token count (stop token included), `(length mod 5) / 4`: for
    runs whose stop tokens leave most completions' text empty."""
    return [(n % 5) / 4.0 for n in completion_lengths]


def even_checksum(prompts, completions, **fields):
    """1.0 where the byte sum of prompt and completion is even (about half of the rows)."""
    return [
        float(sum((p + c).encode("utf-8", "surrogatepass")) % 2 == 0)
        for p, c in zip(prompts, completions, strict=True)
    ]


def first_row_fails(prompts, completions, **fields):
    """The checksum reward, but None for the first completion of every call."""
    values = checksum_reward(prompts, completions)
    return [None, *values[1:]]


def records(run_dir):
    """The metrics.jsonl records of a run."""
    lines = (pathlib.Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def train_records(run_dir):
    """Train-step records without wall-clock values (comparable across runs)."""
    out = []
    for record in records(run_dir):
        if "loss/total" in record or "sft/nll" in record:
            out.append(
                {
                    k: v
                    for k, v in record.items()
                    if k not in ("time", "elapsed") and not k.startswith(("time/", "perf/"))
                }
            )
    return out


def tree_equal(a, b):
    """Whether two lists of arrays are bitwise equal."""
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True)
        for x, y in zip(a, b, strict=True)
    )
