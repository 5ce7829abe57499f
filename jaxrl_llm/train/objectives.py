"""Objectives: what the update step differentiates, one micro-batch at a time.

An `Objective` bundles three pure functions of a batch type:

    loss(params, frozen, batch, norms, kl_coef) -> (loss, metrics)   merge, forward, loss
    normalizers(batch) -> Normalizers                                 additive counts of a part
    check(batch, updates_per_step) -> None                            static validation

`rl_objective` (policy-gradient algorithms, `AlgorithmConfig`) and `sft_objective` (supervised
fine-tuning, `SFTConfig`) are the two built here; an offline preference loss is one more
objective of the same shape over a batch of chosen/rejected sequences. The update step
(`jaxrl_llm.train.update`) is the same for all of them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

import losses
from jaxrl_llm.models import ValueHead, ValueModel
from jaxrl_llm.train.algorithms import AlgorithmConfig, online_dpo_normalizers, rl_loss
from jaxrl_llm.train.batch import (
    Normalizers,
    RLBatch,
    SequenceBatch,
    check_rl_batch,
    check_sequence_batch,
    count_normalizers,
)
from jaxrl_llm.train.logprobs import completion_logprobs, critic_values
from jaxrl_llm.train.params import ModelGraphs
from losses.aggregation import AggMode


class Objective(NamedTuple):
    """The three functions the update step needs from a training objective (module docstring).

    Examples:
      >>> obj = Objective(loss=None, normalizers=count_normalizers, check=lambda b, n: None)
      >>> obj.normalizers is count_normalizers
      True
    """

    loss: Callable[..., tuple[jax.Array, dict[str, jax.Array]]]
    normalizers: Callable[[Any], Normalizers]
    check: Callable[[Any, int], None]
    group_size: int = 1  # the loss assumes groups of this many consecutive rows share a prompt
    row_unit: int = 1  # the loss reads this many consecutive rows together (a DPO pair: 2)

    @property
    def unit(self) -> int:
        """Consecutive rows that every loss call must see whole: `lcm(row_unit, group_size)`.
        The update step splits and shuffles the batch in these units (`train.update`)."""
        return math.lcm(self.row_unit, self.group_size)

    def describe_unit(self) -> str:
        """The unit in words, for error messages.

        Examples:
          >>> Objective(None, None, None, group_size=4).describe_unit()
          "groups of the objective's group_size = 4 rows sharing a prompt"
          >>> Objective(None, None, None, row_unit=2).describe_unit()
          "units of the objective's 2 rows read together (row_unit = 2)"
        """
        if self.row_unit == 1:
            return f"groups of the objective's group_size = {self.group_size} rows sharing a prompt"
        return (
            f"units of the objective's {self.unit} rows read together (row_unit = "
            f"{self.row_unit}"
            + (f", group_size = {self.group_size})" if self.group_size > 1 else ")")
        )


def _normalizers(batch: Any) -> Normalizers:
    return count_normalizers(batch.completion_mask, _target_segments(batch))


def _target_segments(batch: Any) -> jax.Array | None:
    """`[N,T]` segment of each target token of packed rows (`segment_ids[:, 1:]`), or None."""
    segments = getattr(batch, "segment_ids", None)
    return None if segments is None else segments[:, 1:]


def rl_objective(
    config: AlgorithmConfig,
    graphs: ModelGraphs,
    *,
    group_size: int = 1,
    samples_per_prompt: int = 1,
) -> Objective:
    """The objective of a policy-gradient algorithm over `RLBatch`es (`algorithms.rl_loss`).

    The policy runs one forward pass; log-probs and entropies are computed chunk by chunk from
    its completion hidden states (`logprobs.completion_logprobs`). A critic is a `ValueHead` on
    those hidden states (`critic.kind = "head"`) or a separate `ValueModel` forward.

    Args:
      config: the algorithm.
      graphs: the model graphs from `split_models` (with a `value` graph iff `config.critic`).
      group_size: `G > 1` when every batch the loss sees comes in groups of `G` consecutive
        rows with the same prompt: each prompt then runs once per layer in the forward
        passes (`logprobs.completion_hidden`); the same loss up to float rounding. The
        update step keeps each group in one micro-batch (`Objective.unit`).
      samples_per_prompt: `G`, rows per prompt of the (prompt-major) batches; with
        `config.minibatch_unit == "prompt"` the update keeps each prompt's rows in one
        micro-batch (`AlgorithmConfig.update_unit`). Online DPO's unit is its pair.

    Returns:
      An `Objective`.

    Examples:
      >>> from jaxrl_llm.train.algorithms import preset
      >>> rl_objective(preset("ppo"), ModelGraphs(policy=None))
      Traceback (most recent call last):
      ...
      ValueError: rl_objective: algorithm 'ppo' has a critic (kind='model') but `graphs.value` is None; pass the critic to split_models.
    """
    if (config.critic is None) != (graphs.value is None):
        kind = None if config.critic is None else config.critic.kind
        raise ValueError(
            f"rl_objective: algorithm {config.name!r} has "
            + (f"a critic (kind={kind!r})" if kind else "no critic")
            + f" but `graphs.value` is {'None' if graphs.value is None else 'set'}; "
            + ("pass the critic to split_models." if kind else "split without a critic.")
        )

    online_dpo = config.policy_loss.name == "online_dpo"

    def loss(
        params: dict, frozen: dict, batch: RLBatch, norms: Normalizers, kl_coef: Any
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        policy = nnx.merge(graphs.policy, params["policy"], frozen["policy"])
        logp, entropy, hidden = completion_logprobs(
            policy,
            batch,
            temperature=config.temperature,
            chunk_size=config.chunk_size,
            with_entropy=True,
            group_size=group_size,
        )
        values = None
        if config.critic is not None:
            critic = nnx.merge(graphs.value, params["value"], frozen["value"])
            expected = ValueModel if config.critic.kind == "model" else ValueHead
            if not isinstance(critic, expected):
                raise ValueError(
                    f"rl_objective: critic.kind={config.critic.kind!r} expects a "
                    f"{expected.__name__}, got {type(critic).__name__}."
                )
            values = critic_values(
                critic,
                batch,
                hidden=hidden,
                group_size=group_size,
                packed=batch.packed,
                in_micro_batch=True,
            )
        return rl_loss(
            config, batch, norms, logp=logp, entropy=entropy, values=values, kl_coef=kl_coef
        )

    def check(batch: RLBatch, updates_per_step: int) -> None:
        where = "rl_objective"
        if not isinstance(batch, RLBatch):
            raise ValueError(f"{where}: expected an RLBatch, got {type(batch).__name__}.")
        check_rl_batch(batch, where=where)
        if batch.tokens.shape[0] % group_size:  # (the whole batch, or one device's rows)
            raise ValueError(
                f"{where}: {batch.tokens.shape[0]} rows do not form groups of group_size = "
                f"{group_size} rows sharing a prompt."
            )
        if batch.old_logp is None and updates_per_step > 1 and not online_dpo:
            raise ValueError(
                f"{where}: `old_logp` may be None only with one optimizer update per step "
                f"(epochs × minibatches = 1), got {updates_per_step}; compute it with "
                "make_logprob_fn before the update."
            )
        if config.kl.mode != "none" and batch.ref_logp is None:
            raise ValueError(f"{where}: kl.mode={config.kl.mode!r} needs `ref_logp` in the batch.")
        if online_dpo and (batch.ref_logp is None or batch.tokens.shape[0] % 2):
            raise ValueError(
                f"{where}: policy_loss 'online_dpo' needs `ref_logp` in the batch and rows in "
                f"pairs (each prompt's 2 samples), got {batch.tokens.shape[0]} rows"
                + (" without ref_logp." if batch.ref_logp is None else ".")
            )
        if config.critic is not None and (batch.returns is None or batch.old_values is None):
            raise ValueError(f"{where}: a critic needs `returns` and `old_values` in the batch.")
        if config.rollout_correction is not None and batch.rollout_logp is None:
            raise ValueError(f"{where}: `rollout_correction` needs `rollout_logp` in the batch.")

    normalizers = online_dpo_normalizers if online_dpo else _normalizers
    return Objective(
        loss=loss,
        normalizers=normalizers,
        check=check,
        group_size=group_size,
        row_unit=config.update_unit(samples_per_prompt),  # a DPO pair, or a prompt's rows
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTConfig:
    """Supervised fine-tuning: the negative log-likelihood of the completion tokens.

        L = −aggregate(log π(y_t | x, y_<t), m; agg)

    with the global normalisers of the optimizer update (so accumulation does not change it).
    `agg="token_mean"` is TRL's SFT loss; `"seq_mean_token_mean"` OpenRLHF's per-sequence mean.

    Attributes:
      agg: aggregation mode of `losses.aggregate`.
      epochs: passes over each batch.
      minibatches: optimizer updates per epoch.
      shuffle: reshuffle the rows every epoch.
      chunk_size: positions per vocabulary chunk.
      packing: a run packs each step's pairs several to a row (`jaxrl_llm.train.packing`,
        TRL's `packing=True`): the same loss and gradient with fewer padded slots. Every `agg`
        but `seq_mean_token_sum_norm` (whose budget `T` packed rows do not have).
      packing_length: slots per packed row, at least the padded row's `P + T` (None: `P + T`).

    Examples:
      >>> SFTConfig(agg="seq_mean_token_mean").agg
      'seq_mean_token_mean'
    """

    agg: AggMode = "token_mean"
    epochs: int = 1
    minibatches: int = 1
    shuffle: bool = True
    chunk_size: int | None = None
    packing: bool = False
    packing_length: int | None = None

    def __post_init__(self) -> None:
        if self.agg not in losses.AGG_MODES:
            raise ValueError(
                f"SFTConfig: `agg` must be one of {', '.join(losses.AGG_MODES)}, got {self.agg!r}."
            )
        for key in ("epochs", "minibatches"):
            if getattr(self, key) < 1:
                raise ValueError(f"SFTConfig: `{key}` must be >= 1, got {getattr(self, key)!r}.")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(
                f"SFTConfig: `chunk_size` must be >= 1 or null, got {self.chunk_size!r}."
            )
        if self.packing_length is not None and not self.packing:
            raise ValueError("SFTConfig: `packing_length` is set but `packing` is off.")
        if self.packing_length is not None and self.packing_length < 2:
            raise ValueError(
                f"SFTConfig: `packing_length` must be >= 2 or null, got {self.packing_length!r}."
            )
        if self.packing and self.agg == "seq_mean_token_sum_norm":
            raise ValueError(
                "SFTConfig: `packing` with agg='seq_mean_token_sum_norm', which divides by the "
                "completion budget T that packed rows do not have; use another `agg`."
            )


def sft_objective(config: SFTConfig, graphs: ModelGraphs) -> Objective:
    """The SFT objective over `SequenceBatch`es (see `SFTConfig`).

    Metrics: `sft/nll` (the mean NLL per completion token) and `loss/total`.

    Args:
      config: the SFT config.
      graphs: model graphs from `split_models` (policy only).

    Returns:
      An `Objective`.

    Examples:
      >>> sft_objective(SFTConfig(), ModelGraphs(policy=None)).normalizers.__name__
      '_normalizers'
    """

    def loss(
        params: dict, frozen: dict, batch: SequenceBatch, norms: Normalizers, kl_coef: Any
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        del kl_coef
        policy = nnx.merge(graphs.policy, params["policy"], frozen["policy"])
        logp, _, _ = completion_logprobs(policy, batch, chunk_size=config.chunk_size)
        mask = (batch.completion_mask > 0).astype(jnp.float32)
        total = losses.aggregate(
            -logp,
            mask,
            mode=config.agg,
            num_tokens=jnp.maximum(norms.num_tokens, 1.0),
            num_seqs=jnp.maximum(norms.num_seqs, 1.0),
            segment_ids=_target_segments(batch),
        )
        metrics = {
            "sft/nll": jax.lax.stop_gradient(losses.masked_mean(-logp, mask)),
            "loss/total": jax.lax.stop_gradient(total),
        }
        return total, metrics

    def check(batch: SequenceBatch, updates_per_step: int) -> None:
        del updates_per_step
        check_sequence_batch(batch, where="sft_objective")
        if batch.segment_ids is not None and config.agg == "seq_mean_token_sum_norm":
            raise ValueError(
                "sft_objective: agg='seq_mean_token_sum_norm' divides by the completion budget "
                "T, which packed rows (`segment_ids`) do not have; use another `agg`."
            )

    return Objective(loss=loss, normalizers=_normalizers, check=check)
