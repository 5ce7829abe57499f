"""Tunix (`google-tunix`) GRPO on the benchmark's model and workload (`benchmarks.workloads`).

    python -m benchmarks.peers.tunix_grpo '{"model": "tiny", "prompts": 2, ...}' STEPS

Run in the peers' environment. The setup a Tunix user writes: a randomly initialised
`tunix.models.qwen3.Qwen3` of the workload's shape (float32), a frozen copy as the reference,
`RLCluster` with the vanilla rollout engine on a one-device `(fsdp, tp)` mesh (actor, reference
and rollout colocated, so the rollout shares the actor's weights), `GRPOLearner` with
`GRPOConfig(num_generations=G, num_iterations=1, beta=0.04, epsilon=0.2)`, AdamW 1e-3 after
gradient clipping at 1, sampling at temperature 1 (`top_p=1.0`: Tunix samples greedily without
top-p or top-k), prompts left-padded to 16 tokens, `T` new tokens with a stop at EOS, and an
exact-answer reward on the decoded text. Byte tokenizer with the benchmark's ids (bytes 0-255,
PAD 256, BOS 257, EOS 258).

Every step is one GRPO iteration (sample → reward → advantages → reference log-probs →
update). A training hook blocks on each step's loss and records the time; seconds per step is
the median of the gaps between step ends after the first step, without the last gap (Tunix
prepares the next batch's rollout in a producer thread while a step trains, so the last step,
with nothing left to prepare, is shorter); time to first step is the wall time from the start
of model construction to the end of the first step (compilation included).
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import statistics
import sys
import tempfile
import time

from benchmarks.workloads import (
    BETA,
    BYTE_BOS,
    BYTE_EOS,
    BYTE_PAD,
    EPSILON,
    LEARNING_RATE,
    MAX_GRAD_NORM,
    PROMPT_LEN,
    Workload,
    arithmetic_prompts,
    emit,
    exact_answer,
    load_average,
)


def check_installed() -> None:
    """Raise ImportError when Tunix is not importable here."""
    import tunix  # noqa: F401
    from tunix.rl.grpo import grpo_learner  # noqa: F401


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255, PAD 256, BOS 257, EOS 258 (Tunix's tokenizer protocol)."""

    def encode(self, text: str, **kwargs) -> list[int]:
        return list(str(text).encode("utf-8"))

    def decode(self, ids, **kwargs) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", "replace")

    def bos_id(self) -> int:
        return BYTE_BOS

    def eos_id(self) -> int:
        return BYTE_EOS

    def pad_id(self) -> int:
        return BYTE_PAD


def _model(w: Workload, seed: int):
    return tunix_qwen3(w.shape, seed)


def tunix_qwen3(s, seed: int):
    """Tunix's own Qwen3 with the shape `s` (a `workloads.ModelShape`), initialised by Tunix."""
    from flax import nnx
    from tunix.models.qwen3 import model as qwen3

    config = qwen3.ModelConfig(
        num_layers=s.num_layers,
        vocab_size=s.vocab_size,
        embed_dim=s.hidden_size,
        hidden_dim=s.intermediate_size,
        num_heads=s.num_heads,
        head_dim=s.head_dim,
        num_kv_heads=s.num_kv_heads,
        rope_theta=10_000,  # ModelConfig's and transformers' Qwen3Config default: the same
        norm_eps=1e-6,
        use_tied_embedding=s.tie_embeddings,
    )
    return qwen3.Qwen3(config, rngs=nnx.Rngs(seed))


class _StepTimes:
    """A Tunix training hook (`tunix.sft.hooks.TrainingHooks`' methods): the time at the end of
    every train step, after blocking on its loss."""

    def __init__(self):
        self.times: list[float] = []

    def on_train_start(self, ctx):
        pass

    def on_train_end(self, ctx):
        pass

    def on_train_step_start(self, ctx):
        pass

    def on_train_step_end(self, ctx, train_step, train_loss):
        import jax

        jax.block_until_ready(train_loss)
        self.times.append(time.perf_counter())

    def on_eval_step_start(self, ctx):
        pass

    def on_eval_step_end(self, ctx, eval_loss):
        pass


def run(w: Workload, steps: int) -> dict:
    import jax
    import numpy as np
    import optax
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout
    from tunix.sft import metrics_logger

    started = time.perf_counter()
    auto = (jax.sharding.AxisType.Auto,) * 2
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=auto, devices=jax.devices()[:1])
    with mesh:
        actor = _model(w, seed=0)
        reference = _model(w, seed=0)
    T = w.new_tokens
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=T,
        max_prompt_length=PROMPT_LEN,
        kv_cache_size=PROMPT_LEN + T,  # what the rollout needs (its decode reads every slot)
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        eos_tokens=[BYTE_EOS],
    )
    log_dir = tempfile.mkdtemp(prefix="tunix_bench_")
    training = rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=optax.chain(
            optax.clip_by_global_norm(MAX_GRAD_NORM),
            optax.adamw(LEARNING_RATE, weight_decay=0.0),  # optax's default is 1e-4
        ),
        eval_every_n_steps=10**9,
        max_steps=steps,
        metrics_logging_options=metrics_logger.MetricsLoggerOptions(
            log_dir=log_dir, flush_every_n_steps=10**6
        ),
    )
    cluster = rl_cluster_lib.RLCluster(
        actor=actor,
        reference=reference,
        tokenizer=ByteTokenizer(),
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={
                rl_cluster_lib.Role.ACTOR: mesh,
                rl_cluster_lib.Role.REFERENCE: mesh,
                rl_cluster_lib.Role.ROLLOUT: mesh,
            },
            rollout_engine="vanilla",
            offload_to_cpu=False,
            training_config=training,
            rollout_config=rollout,
        ),
    )
    timer = _StepTimes()
    cluster.actor_trainer.with_training_hooks(timer)

    answers: dict[str, str] = {}

    def reward(prompts, completions, **kwargs):
        return [exact_answer(c, answers[p]) for p, c in zip(prompts, completions, strict=True)]

    learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster,
        algo_config=grpo_learner.GRPOConfig(
            num_generations=w.samples, num_iterations=1, beta=BETA, epsilon=EPSILON
        ),
        reward_fns=[reward],
    )
    pairs = arithmetic_prompts(w.prompts * (steps + 1), seed=0)
    answers.update(pairs)
    batches = [
        {"prompts": np.asarray([p for p, _ in pairs[i * w.prompts : (i + 1) * w.prompts]])}
        for i in range(steps + 1)
    ]
    learner.train(batches)
    times = timer.times
    if len(times) < 2:
        raise RuntimeError(f"tunix ran {len(times)} steps, expected {steps}")
    gaps = [b - a for a, b in itertools.pairwise(times)]
    if len(gaps) > 2:  # the last step's rollout was prepared while the one before trained
        gaps = gaps[:-1]
    return {
        "impl": "tunix",
        "workload": w.__dict__,
        "seconds_per_step": round(statistics.median(gaps), 5),
        "step_times": [round(g, 5) for g in gaps],
        "time_to_first_step_s": round(times[0] - started, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "load_avg_1min": load_average(),
        "jax": jax.__version__,
        "tunix": _version("google-tunix"),
    }


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    workload = Workload(**json.loads(sys.argv[1]))
    emit(run(workload, int(sys.argv[2])))
