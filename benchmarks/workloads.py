"""The GRPO benchmark's workloads and FLOP model, shared by every implementation (issue 9).

Pure Python (no jax / torch import), so the peer adapters (`benchmarks/peers/`) import it
from another virtual environment and run exactly the same shapes and hyperparameters.

Models (Qwen3-shaped, byte vocabulary of 259 ids):

    tiny   2 layers, width 64,  MLP 128, 4 heads × 16, 2 KV heads, tied embeddings
    small  4 layers, width 256, MLP 768, 8 heads × 32, 4 KV heads

Workloads: `B` prompts × `G` samples × `T` new tokens, prompts of `P = 16` tokens (arithmetic
prompts left-padded), temperature 1; GRPO with β = 0.04 (k3 KL loss to a frozen reference),
ε = 0.2, one optimizer update per rollout batch (μ = 1, so the ratio is 1 and no separate
old-policy forward is needed), AdamW with learning rate 1e-3, gradient clipping at 1.

FLOPs (multiply-adds × 2) of one GRPO iteration, for `N = B·G` rows, `S = P + T`, per-layer
matmul parameters `M_l = D·hd·(2H + 2K) + 3·D·F`, `M = L·M_l`, and attention computed over
all `S` keys (masked, not skipped):

    forward(rows, S)   = rows·(2·M·S + 4·L·H·hd·S²) + 2·D·V·rows·T      logits on T positions
    sample             = B·(2·M·P + 4·L·H·hd·P²) + 2·D·V·B              prefill, first logits
                         + N·(T − 1)·(2·M + 4·L·H·hd·(P + T) + 2·D·V)     decode over the cache
                                                          (the prefill's logits give token 1)
    reference log-probs = forward(N, S)
    update             = 3·forward(N, S)                                 forward + backward
    iteration          = sample + reference + update

These are the model's FLOPs, the same for every implementation: an implementation that
recomputes or skips work does not change its count, so GFLOP/s compare like with like.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import platform
import subprocess
from typing import Any

VOCAB = 259
PROMPT_LEN = 16
BETA = 0.04
EPSILON = 0.2
LEARNING_RATE = 1e-3
MAX_GRAD_NORM = 1.0


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """A Qwen3-shaped decoder."""

    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_embeddings: bool
    vocab_size: int = VOCAB

    def scaled(self, width_factor: int) -> ModelShape:
        """Width × `width_factor` (MLP too, head dim fixed, heads scaled)."""
        return dataclasses.replace(
            self,
            name=f"{self.name}_w{self.hidden_size * width_factor}",
            hidden_size=self.hidden_size * width_factor,
            intermediate_size=self.intermediate_size * width_factor,
            num_heads=self.num_heads * width_factor,
            num_kv_heads=self.num_kv_heads * width_factor,
        )

    @property
    def layer_matmul_params(self) -> int:
        D, hd = self.hidden_size, self.head_dim
        attn = D * hd * (2 * self.num_heads + 2 * self.num_kv_heads)
        return attn + 3 * D * self.intermediate_size

    def model_config(self) -> Any:
        """This shape as a jaxrl_llm `ModelConfig` (imported here: the peers' venv reads this
        module without jaxrl_llm)."""
        from jaxrl_llm.models import ModelConfig

        return ModelConfig(
            family="qwen3",
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            tie_embeddings=self.tie_embeddings,
        )

    @property
    def num_params(self) -> int:
        """All parameters (embeddings once when tied; norms included)."""
        D, V = self.hidden_size, self.vocab_size
        norms = self.num_layers * (2 * D + 2 * self.head_dim) + D
        embed = D * V if self.tie_embeddings else 2 * D * V
        return self.num_layers * self.layer_matmul_params + embed + norms


MODELS = {
    "tiny": ModelShape("tiny", 2, 64, 128, 4, 2, 16, tie_embeddings=True),
    "small": ModelShape("small", 4, 256, 768, 8, 4, 32, tie_embeddings=False),
}


@dataclasses.dataclass(frozen=True)
class Workload:
    """`prompts` × `samples` × `new_tokens` on one model."""

    model: str
    prompts: int
    samples: int
    new_tokens: int

    @property
    def name(self) -> str:
        return f"{self.model}__{self.prompts}x{self.samples}x{self.new_tokens}"

    @property
    def shape(self) -> ModelShape:
        if self.model in MODELS:
            return MODELS[self.model]
        base, width = self.model.split("_w")
        factor = int(width) // MODELS[base].hidden_size
        return MODELS[base].scaled(factor)


WORKLOADS = [
    Workload("tiny", 2, 4, 16),
    Workload("tiny", 8, 8, 64),
    Workload("small", 2, 4, 16),
    Workload("small", 8, 8, 64),
]


def forward_flops(shape: ModelShape, rows: int, seq: int, logit_positions: int) -> int:
    """FLOPs of one forward pass over `rows` sequences of `seq` tokens (module docstring)."""
    M = shape.num_layers * shape.layer_matmul_params
    attention = 4 * shape.num_layers * shape.num_heads * shape.head_dim * seq * seq
    logits = 2 * shape.hidden_size * shape.vocab_size * rows * logit_positions
    return rows * (2 * M * seq + attention) + logits


def sample_flops(shape: ModelShape, prompts: int, samples: int, new_tokens: int) -> int:
    """FLOPs of the rollout: prefill of the prompts (whose logits give the first token), then
    `T − 1` decode steps of `N` rows."""
    M = shape.num_layers * shape.layer_matmul_params
    P, T, N = PROMPT_LEN, new_tokens, prompts * samples
    attn = 4 * shape.num_layers * shape.num_heads * shape.head_dim
    DV = 2 * shape.hidden_size * shape.vocab_size
    prefill = prompts * (2 * M * P + attn * P * P) + DV * prompts
    decode = N * (T - 1) * (2 * M + attn * (P + T) + DV)
    return prefill + decode


def iteration_flops(w: Workload) -> dict[str, int]:
    """FLOPs of one GRPO iteration and its parts (module docstring)."""
    shape, N, S = w.shape, w.prompts * w.samples, PROMPT_LEN + w.new_tokens
    fwd = forward_flops(shape, N, S, w.new_tokens)
    parts = {
        "sample": sample_flops(shape, w.prompts, w.samples, w.new_tokens),
        "reference": fwd,
        "update": 3 * fwd,
    }
    parts["iteration"] = sum(parts.values())
    return parts


def load_average() -> float:
    """The 1-minute load average (`uptime`): the machine is shared."""
    return round(os.getloadavg()[0], 2)


def machine() -> dict:
    """Where the numbers were taken."""
    info = {"platform": platform.platform(), "cpu_count": os.cpu_count()}
    try:
        model = subprocess.run(
            ["sh", "-c", "grep -m1 'model name' /proc/cpuinfo"], capture_output=True, text=True
        ).stdout
        info["cpu"] = model.split(":", 1)[-1].strip()
    except OSError:
        pass
    return info


def write_results(path: str | None, results: list[dict]) -> None:
    """Write a benchmark's rows with `machine()` to the JSON file `path` (None: nowhere)."""
    if path:
        out = {"machine": machine(), "results": results}
        pathlib.Path(path).write_text(json.dumps(out, indent=1) + "\n")


def emit(result: dict) -> None:
    """Print a worker's result as the last line of its output (read by `bench_grpo`)."""
    print("RESULT " + json.dumps(result), flush=True)


# ---------------------------------------------------------------- the peers' task (pure Python)

BYTE_PAD, BYTE_BOS, BYTE_EOS = 256, 257, 258


def arithmetic_prompts(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """`count` (prompt, answer) pairs `"a+b="`, `a, b < 100`: the built-in arithmetic task's
    format (`jaxrl_llm.data.tasks.arithmetic`), drawn with Python's `random` so the peers'
    environments need no jaxrl_llm."""
    import random

    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        a, b = rng.randrange(100), rng.randrange(100)
        pairs.append((f"{a}+{b}=", str(a + b)))
    return pairs


def exact_answer(completion: str, answer: str) -> float:
    """1.0 when the completion (up to its end-of-sequence) is the answer, else 0.0."""
    return float(completion.strip() == answer)
