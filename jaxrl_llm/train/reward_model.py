"""Reward-model training, the first stage of RLHF: Bradley-Terry on preference pairs.

A reward model is a `ValueModel` (decoder backbone + scalar head); the score of a sequence is
its value at the last real token, as Hugging Face's `*ForSequenceClassification` reads the
last non-padding token:

    r(x, y) = v_last(prompt x + completion y)
    loss    = mean_pairs −log σ(r(x, y_c) − r(x, y_r) − margin)          (Bradley-Terry)
            + center_coef · mean_pairs (r(x, y_c) + r(x, y_r))²          (TRL's centring term)

over the valid pairs of the update (`losses.bradley_terry_loss`; Ouyang et al., arXiv
2203.02155; the margin as Llama 2, arXiv 2307.09288; the centring term as TRL's
`RewardConfig.center_rewards_coefficient`, Eisenstein et al., arXiv 2312.09244). The data are
the paired preference records of `jaxrl_llm.data` (`{"prompt", "chosen", "rejected"}`), batched
as for DPO. `train_reward_model` runs the whole loop; `save_pretrained` then writes the model
as a `*ForSequenceClassification` checkpoint that `fn: reward_model` (`jaxrl_llm.rewards`)
scores RL completions with.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

import losses
from jaxrl_llm.config import ConfigError
from jaxrl_llm.models import ValueModel, positions_from_mask
from jaxrl_llm.models._sharded_ops import plain_layout
from jaxrl_llm.train.batch import Normalizers, SequenceBatch, prompt_length
from jaxrl_llm.train.objectives import Objective
from jaxrl_llm.train.pair_packing import packed_pair_scores
from jaxrl_llm.train.params import ModelGraphs
from jaxrl_llm.train.preference import (
    PreferenceBatch,
    _offline_examples,
    _offline_steps,
    call_on_pairs,
    pack_preference_batch,
    pair_valid,
    preference_normalizers,
)
from jaxrl_llm.train.preference_config import _check_packing


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardModelConfig:
    """The reward-model objective (module docstring).

    Attributes:
      margin: the Bradley-Terry margin subtracted from every pair's score difference.
      center_coef: weight of the centring term `mean (r_c + r_r)²` (0: off).
      epochs: passes over each batch.
      minibatches: optimizer updates per epoch.
      shuffle: reshuffle the pairs every epoch.
      shared_prompt: each pair's prompt runs once per layer for both completions (as
        `PreferenceConfig.shared_prompt`: chosen and rejected must share their prompt tokens
        and padding, as `make_preference_batch` builds them; the runner turns it on with
        `train.shared_prompt_forward`).
      packing: several pairs per row without padding, each pair's prompt once, as
        `PreferenceConfig.packing` (`jaxrl_llm.train.pair_packing`; the scores read at each
        sequence's last real token: `packed_pair_scores`). `minibatches > 1` needs
        `shuffle: false`. Takes precedence over `shared_prompt`.
      packing_length: slots per packed row (None: `P + 2T` of each batch's buckets).

    Examples:
      >>> RewardModelConfig(center_coef=0.01).margin
      0.0
      >>> RewardModelConfig(center_coef=-1.0)
      Traceback (most recent call last):
      ...
      jaxrl_llm.config.ConfigError: RewardModelConfig: `center_coef` must be a finite number >= 0, got -1.0.
    """

    margin: float = 0.0
    center_coef: float = 0.0
    epochs: int = 1
    minibatches: int = 1
    shuffle: bool = True
    shared_prompt: bool = False
    packing: bool = False
    packing_length: int | None = None

    def __post_init__(self) -> None:
        for key in ("shared_prompt", "packing"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(
                    f"RewardModelConfig: `{key}` must be a bool, got {getattr(self, key)!r}."
                )
        try:
            _check_packing(self, "RewardModelConfig")
        except ValueError as err:
            raise ConfigError(str(err)) from None
        for key in ("epochs", "minibatches"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"RewardModelConfig: `{key}` must be an int >= 1, got {value!r}.")
        if not math.isfinite(self.margin):
            raise ConfigError(f"RewardModelConfig: `margin` must be finite, got {self.margin}.")
        if not math.isfinite(self.center_coef) or self.center_coef < 0:
            raise ConfigError(
                "RewardModelConfig: `center_coef` must be a finite number >= 0, got "
                f"{self.center_coef}."
            )


def sequence_scores(
    model: ValueModel, sequences: SequenceBatch, *, group_size: int = 1
) -> jax.Array:
    """`[N]` float32: each row's value at its last real token (attention mask 1).

    `group_size = G > 1`: the rows come in groups of `G` consecutive rows with the same prompt
    (tokens and padding), and each prompt runs once per layer
    (`Decoder.shared_prompt_hidden_states`; the same scores up to float rounding).

    Examples:
      >>> from jaxrl_llm.models import ModelConfig
      >>> cfg = ModelConfig(family="qwen3", vocab_size=11, hidden_size=8, intermediate_size=16,
      ...                   num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
      >>> rm = ValueModel(cfg, rngs=nnx.Rngs(0))
      >>> tokens = jnp.array([[0, 3, 4, 0], [1, 2, 3, 4]])
      >>> mask = jnp.array([[0, 1, 1, 0], [1, 1, 1, 1]])
      >>> s = sequence_scores(rm, SequenceBatch(tokens, mask, jnp.ones((2, 2))))
      >>> values = rm(tokens, positions_from_mask(mask), attention_mask=mask)
      >>> bool(s[0] == values[0, 2]), bool(s[1] == values[1, 3])
      (True, True)
    """
    mask = jnp.asarray(sequences.attention_mask)
    positions = positions_from_mask(mask)
    if group_size == 1:
        values = model(sequences.tokens, positions, attention_mask=mask)
    else:
        hidden = model.backbone.shared_prompt_hidden_states(
            sequences.tokens,
            positions,
            attention_mask=mask,
            prompt_length=prompt_length(sequences),
            group_size=group_size,
        )
        values = model.head(hidden)
    S = mask.shape[1]
    last = S - 1 - jnp.argmax(jnp.flip(mask > 0, axis=1), axis=1)
    return jnp.take_along_axis(values, last[:, None], axis=1)[:, 0].astype(jnp.float32)


def reward_model_loss(
    config: RewardModelConfig,
    chosen: jax.Array,
    rejected: jax.Array,
    valid: jax.Array,
    norms: Normalizers,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The loss of one (micro-)batch's pairs, normalised by the update's valid pairs
    `max(norms.num_seqs, 1)` (so micro-batch losses add up to the whole batch's), and its metrics.

    Examples:
      >>> n = Normalizers(jnp.array(2.0), jnp.array(2.0), jnp.array(1.0))
      >>> loss, m = reward_model_loss(RewardModelConfig(), jnp.array([1.0, 0.2]),
      ...                             jnp.array([0.0, 0.5]), jnp.ones(2), n)
      >>> round(float(loss), 4), float(m["rm/accuracy"])
      (0.5838, 0.5)
    """
    local, metrics = losses.bradley_terry_loss(chosen, rejected, margin=config.margin, valid=valid)
    count = jnp.sum(valid)
    pairs = jnp.maximum(norms.num_seqs, 1.0)  # an update without valid pairs: loss 0, not NaN
    loss = local * count / pairs
    metrics = {**metrics, "loss/bradley_terry": loss}
    if config.center_coef:
        center = config.center_coef * jnp.sum(valid * (chosen + rejected) ** 2) / pairs
        metrics["loss/center"] = center
        loss = loss + center
    metrics["loss/total"] = loss
    return loss, metrics


def reward_model_objective(config: RewardModelConfig, graphs: ModelGraphs) -> Objective:
    """The objective of a reward model over `PreferenceBatch`es: one forward scores the chosen
    and rejected sequences together (`concat_sequences`; with `config.shared_prompt`, where the
    model builds its plain program, the pairs interleaved and each prompt run once), then
    `reward_model_loss`. The reward model is split as the "policy" entry of `split_models`
    (`graphs.policy`).

    Examples:
      >>> obj = reward_model_objective(RewardModelConfig(), ModelGraphs(policy=None))
      >>> obj.normalizers is preference_normalizers
      True
    """

    def loss(
        params: dict, frozen: dict, batch: PreferenceBatch, norms: Normalizers, kl_coef: Any
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        del kl_coef
        model = nnx.merge(graphs.policy, params["policy"], frozen["policy"])
        if batch.packed is not None and plain_layout():  # the update's micro-batch: `row`
            scores = packed_pair_scores(model, batch.packed, in_micro_batch=True)
            return reward_model_loss(config, scores[:, 0], scores[:, 1], pair_valid(batch), norms)
        group_size = 2 if config.shared_prompt else 1
        chosen, rejected = call_on_pairs(
            lambda seqs: sequence_scores(model, seqs, group_size=group_size),
            batch.chosen,
            batch.rejected,
            shared_prompt=config.shared_prompt,
        )
        return reward_model_loss(config, chosen, rejected, pair_valid(batch), norms)

    def check(batch: PreferenceBatch, updates_per_step: int) -> None:
        del updates_per_step
        if not isinstance(batch, PreferenceBatch) or batch.rejected is None:
            raise ValueError(
                "reward_model_objective: a reward model trains on pairs: a PreferenceBatch with "
                "`rejected` sequences."
            )

    return Objective(loss=loss, normalizers=preference_normalizers, check=check)


def train_reward_model(
    model: ValueModel,
    tokenizer: Any,
    data: str | pathlib.Path | Sequence[Any],
    config: RewardModelConfig,
    optim_config: Any,
    *,
    steps: int,
    batch_size: int,
    seed: int = 0,
    data_config: Any = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    trainable: tuple[str, ...] = (),
    frozen: tuple[str, ...] = (),
) -> tuple[ValueModel, list[dict[str, float]]]:
    """One complete reward-model run: load, tokenize, batch, update; no I/O else.

    Each step draws `batch_size` pairs in a seeded order reshuffled every epoch
    (`jaxrl_llm.data.next_batch`), builds a bucketed `PreferenceBatch`
    (`jaxrl_llm.data.make_preference_batch`; its pairs packed with `config.packing`) and runs
    the compiled update step
    (`optim_config.accumulation_steps` micro-batches). The metrics of a step are those of its
    batch before the update: `loss/total` (`loss/bradley_terry` + `loss/center`),
    `rm/accuracy` (pairs with `r_c > r_r`),
    `rm/margin`, `rm/chosen_mean`, `rm/rejected_mean`, `optim/…`.

    Args:
      model: the `ValueModel` (its arrays are donated: use the returned model afterwards).
      tokenizer: a `jaxrl_llm.tokenizer` tokenizer.
      data: a JSONL path, records `{"prompt", "chosen", "rejected"}`, or `TokenizedPreference`s.
      config: the `RewardModelConfig`.
      optim_config: the `OptimConfig`.
      steps: update steps (batches).
      batch_size: pairs per batch.
      seed: data order.
      data_config: `jaxrl_llm.data.PreferenceDataConfig` (None: its defaults).
      on_step: called as `on_step(step, metrics)` after every step.
      trainable, frozen: regexes of the parameter paths to train / to freeze (`split_models`;
        paths start with `policy.`); () trains every parameter. A LoRA-adapted model trains
        its adapters alone with `trainable=(LORA_PATTERN,)` (`jaxrl_llm.models`), and its score
        head with them with `(LORA_PATTERN, "^policy[.]head[.]")`.

    Returns:
      `(model, history)`: the trained reward model and one dict of float metrics per step.

    Examples:
      >>> from jaxrl_llm.data import ArithmeticConfig, arithmetic_preference_records
      >>> from jaxrl_llm.models import ModelConfig
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> from jaxrl_llm.train import OptimConfig
      >>> cfg = ModelConfig(family="qwen3", vocab_size=259, hidden_size=16, intermediate_size=32,
      ...                   num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8)
      >>> records = arithmetic_preference_records(ArithmeticConfig(max_digits=1, train_size=8))
      >>> rm, history = train_reward_model(ValueModel(cfg, rngs=nnx.Rngs(0)), ByteTokenizer(),
      ...     records, RewardModelConfig(), OptimConfig(learning_rate=1e-3), steps=2,
      ...     batch_size=4)
      >>> len(history), "rm/accuracy" in history[0]
      (2, True)
    """
    from jaxrl_llm.train.optim import make_optimizer
    from jaxrl_llm.train.params import split_models
    from jaxrl_llm.train.state import init_train_state
    from jaxrl_llm.train.update import make_update_step

    if not isinstance(model, ValueModel):
        raise ValueError(
            f"train_reward_model: `model` must be a ValueModel, got {type(model).__name__}."
        )
    examples, data_config = _offline_examples(
        "train_reward_model", data, tokenizer, data_config, steps, batch_size, False
    )
    graphs, params, fixed = split_models(model, trainable=trainable, frozen=frozen)
    tx = make_optimizer(optim_config)
    state = init_train_state(params, fixed, tx, key=jax.random.key(seed))
    update = make_update_step(
        reward_model_objective(config, graphs),
        tx,
        epochs=config.epochs,
        minibatches=config.minibatches,
        shuffle=config.shuffle,
        accumulation_steps=optim_config.accumulation_steps,
    )
    parts = config.minibatches * optim_config.accumulation_steps

    def step(state: Any, batch: PreferenceBatch) -> tuple[Any, dict[str, jax.Array]]:
        return update(
            state, pack_preference_batch(config, batch, parts=parts, pad_id=tokenizer.pad_id)
        )

    state, history = _offline_steps(
        state, step, examples, tokenizer, data_config, steps, batch_size, seed, on_step
    )
    trained = nnx.merge(graphs.policy, state.params["policy"], state.frozen["policy"])
    return trained, history
