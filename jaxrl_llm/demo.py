"""`make demo`: the policy losses of `losses` learning a verifiable task, compared side by side.

A deliberately tiny "language model" — one table of logits per prompt and position, `[B,T,V]` —
samples `G` completions per prompt that end at an EOS token. The verifiable reward is the fraction
of a hidden target answer (including its EOS) reproduced in place. Each recipe of
`configs/demo_losses.yaml` is a choice of advantage estimator, policy loss and aggregation
(ALGORITHMS.md §5.2), trained with Adam for the same number of steps on the same seeds. The whole
run of a recipe — sample, score, advantages, `epochs` PPO-style updates per batch — is one compiled
`lax.scan`, vmapped over seeds (the fully compiled RL iteration of DESIGN.md in miniature).
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import optax

import losses
from jaxrl_llm.config import build, load_yaml

EOS = 0
DEFAULT_CONFIG = pathlib.Path(__file__).resolve().parents[1] / "configs" / "demo_losses.yaml"

AdvantageName = Literal["grpo", "dr_grpo", "batch_std", "rloo"]
LossName = Literal["ppo_clip", "gspo", "cispo", "sapo", "gmpo"]
AggName = Literal[
    "token_mean",
    "token_sum",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recipe:
    """One algorithm: advantage estimator × policy loss × aggregation (+ KL to the reference)."""

    name: str
    advantages: AdvantageName = "grpo"
    loss: LossName = "ppo_clip"
    clip_low: float = 0.2
    clip_high: float = 0.2
    agg: AggName = "token_mean"
    kl_coef: float = 0.0

    def __post_init__(self) -> None:
        for key in ("clip_low", "clip_high", "kl_coef"):
            if getattr(self, key) < 0:
                raise ValueError(f"recipe {self.name!r}: `{key}` must be >= 0.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """The toy task and the training budget shared by every recipe."""

    prompts: int = 8
    group_size: int = 8
    max_length: int = 8
    vocab: int = 6
    steps: int = 60
    epochs: int = 2
    learning_rate: float = 0.05
    seeds: int = 3
    seed: int = 0
    recipes: tuple[Recipe, ...] = ()

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError("demo: `group_size` must be >= 2 for group advantage estimators.")
        if self.max_length < 3 or self.vocab < 3:
            raise ValueError("demo: `max_length` and `vocab` must be >= 3.")
        for key in ("prompts", "steps", "epochs", "seeds"):
            if getattr(self, key) < 1:
                raise ValueError(f"demo: `{key}` must be >= 1.")
        if not self.recipes:
            raise ValueError("demo: `recipes` must list at least one recipe.")


def make_targets(key: jax.Array, config: DemoConfig) -> tuple[jax.Array, jax.Array]:
    """Hidden answers `[B,T]` (tokens 1..V−1, then EOS, then EOS padding) and their lengths `[B]`."""
    k_len, k_tok = jax.random.split(key)
    B, T, V = config.prompts, config.max_length, config.vocab
    lengths = jax.random.randint(k_len, (B,), 1, T)  # answer tokens before EOS
    tokens = jax.random.randint(k_tok, (B, T), 1, V)
    targets = jnp.where(jnp.arange(T)[None, :] < lengths[:, None], tokens, EOS)
    return targets, lengths


def completion_mask(tokens: jax.Array) -> jax.Array:
    """1 on every token up to and including the first EOS."""
    is_eos = (tokens == EOS).astype(jnp.int32)
    before = jnp.cumsum(is_eos, axis=-1) - is_eos
    return (before == 0).astype(jnp.float32)


def verifiable_reward(tokens, mask, targets, lengths) -> jax.Array:
    """Fraction of the answer (its `L` tokens and the EOS) reproduced in place: `[B,G]` in [0,1]."""
    T = tokens.shape[-1]
    in_answer = (jnp.arange(T)[None, :] <= lengths[:, None]).astype(jnp.float32)  # [B,T]
    hits = (tokens == targets[:, None, :]) * mask * in_answer[:, None, :]
    return jnp.sum(hits, -1) / (lengths[:, None] + 1.0)


def _advantages(rewards: jax.Array, name: str) -> jax.Array:
    if name == "rloo":
        return losses.rloo_advantages(rewards)
    scale = {"grpo": "group", "dr_grpo": "none", "batch_std": "batch"}[name]
    return losses.group_advantages(rewards, scale=scale)


def _policy_loss(recipe: Recipe) -> Callable[..., tuple[jax.Array, dict]]:
    clips = {"clip_low": recipe.clip_low, "clip_high": recipe.clip_high}
    table: dict[str, tuple[Callable, dict[str, Any]]] = {
        "ppo_clip": (losses.ppo_clip_loss, {**clips, "agg": recipe.agg}),
        "gspo": (losses.gspo_loss, {**clips, "agg": recipe.agg}),
        "cispo": (losses.cispo_loss, {**clips, "agg": recipe.agg}),
        "sapo": (losses.sapo_loss, {"agg": recipe.agg}),
        "gmpo": (losses.gmpo_loss, clips),
    }
    fn, kwargs = table[recipe.loss]
    return lambda *args: fn(*args, **kwargs)


def make_train(config: DemoConfig, recipe: Recipe) -> Callable[[jax.Array], dict[str, jax.Array]]:
    """A pure function `key -> metrics[steps]` that trains one recipe from scratch."""
    B, G, T, V = config.prompts, config.group_size, config.max_length, config.vocab
    optimizer = optax.adam(config.learning_rate)
    policy_loss = _policy_loss(recipe)

    def logits_of(table: jax.Array) -> jax.Array:  # [B,T,V] -> [N,T,V]
        return jnp.repeat(table, G, axis=0)

    def train(key: jax.Array) -> dict[str, jax.Array]:
        k_task, k_init, k_steps = jax.random.split(key, 3)
        targets, lengths = make_targets(k_task, config)
        params = 0.1 * jax.random.normal(k_init, (B, T, V))
        ref_logits = logits_of(params)

        def iteration(carry, step_key):
            params, opt_state = carry
            logits = logits_of(params)
            tokens = jax.random.categorical(step_key, logits)  # [N,T]
            mask = completion_mask(tokens)
            rewards = verifiable_reward(
                tokens.reshape(B, G, T), mask.reshape(B, G, T), targets, lengths
            )
            adv = losses.broadcast_to_tokens(_advantages(rewards, recipe.advantages), mask)
            old_logp = losses.token_logprobs(logits, tokens)
            ref_logp = losses.token_logprobs(ref_logits, tokens)

            def objective(p):
                logp = losses.token_logprobs(logits_of(p), tokens)
                pg, metrics = policy_loss(logp, old_logp, adv, mask)
                kl, kl_metrics = losses.kl_loss(logp, ref_logp, mask, agg=recipe.agg)
                return pg + recipe.kl_coef * kl, {**metrics, **kl_metrics}

            def epoch(carry, _):
                p, s = carry
                (_, metrics), grads = jax.value_and_grad(objective, has_aux=True)(p)
                updates, s = optimizer.update(grads, s, p)
                return (optax.apply_updates(p, updates), s), metrics

            (params, opt_state), metrics = jax.lax.scan(
                epoch, (params, opt_state), None, length=config.epochs
            )
            entropy = losses.entropy_from_logits(logits)
            out = {
                "reward": jnp.mean(rewards),
                "solved": jnp.mean((rewards >= 1.0).astype(jnp.float32)),
                "length": jnp.mean(jnp.sum(mask, -1)),
                "entropy": losses.masked_mean(entropy, mask),
                "kl": metrics["kl/mean"][0],
                "clip_frac": metrics.get("policy/clip_frac", jnp.zeros((config.epochs,)))[-1],
            }
            return (params, opt_state), out

        keys = jax.random.split(k_steps, config.steps)
        _, history = jax.lax.scan(iteration, (params, optimizer.init(params)), keys)
        return history

    return train


def run(config: DemoConfig, print_fn: Callable[[str], None] = print) -> dict[str, dict[str, float]]:
    """Train every recipe on `config.seeds` seeds (vmapped) and print one comparison table."""
    keys = jax.random.split(jax.random.key(config.seed), config.seeds)
    print_fn(
        f"Toy verifiable task: {config.prompts} prompts x G={config.group_size} samples, "
        f"answers of up to {config.max_length - 1} tokens from a vocabulary of {config.vocab}; "
        f"{config.steps} steps x {config.epochs} epochs, Adam lr {config.learning_rate}, "
        f"{config.seeds} seeds.\n"
    )
    header = (
        f"{'recipe':<14}{'adv':<10}{'loss':<10}{'agg':<25}{'reward0':>8}{'reward':>8}"
        f"{'solved':>8}{'KL':>8}{'entropy':>9}{'length':>8}{'clip%':>7}{'sec':>6}"
    )
    print_fn(header)
    print_fn("-" * len(header))
    results = {}
    for recipe in config.recipes:
        start = time.perf_counter()
        history = jax.jit(jax.vmap(make_train(config, recipe)))(keys)
        history = jax.tree.map(lambda x: jax.device_get(x).mean(0), history)  # mean over seeds
        seconds = time.perf_counter() - start
        final = {k: float(v[-5:].mean()) for k, v in history.items()}
        final["reward0"] = float(history["reward"][:5].mean())
        results[recipe.name] = final
        agg = "geometric (per seq)" if recipe.loss == "gmpo" else recipe.agg  # GMPO's own mean
        print_fn(
            f"{recipe.name:<14}{recipe.advantages:<10}{recipe.loss:<10}{agg:<25}"
            f"{final['reward0']:>8.3f}{final['reward']:>8.3f}{final['solved']:>8.3f}"
            f"{final['kl']:>8.3f}{final['entropy']:>9.3f}{final['length']:>8.2f}"
            f"{100 * final['clip_frac']:>7.1f}{seconds:>6.1f}"
        )
    print_fn(
        "\nreward0/reward: mean reward over the first/last 5 steps; solved: share of completions "
        "that reproduce the whole answer;\nKL: k3 estimate to the initial policy; clip%: tokens "
        "clipped in the last epoch. Every recipe starts from the same seeds."
    )
    return results


def load_config(path: str | pathlib.Path = DEFAULT_CONFIG) -> DemoConfig:
    """Build a validated `DemoConfig` from YAML (unknown keys and bad values fail here)."""
    return build(DemoConfig, load_yaml(path))
