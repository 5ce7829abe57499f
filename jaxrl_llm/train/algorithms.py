"""RL algorithms as configs: advantage estimator × policy loss × aggregation × KL × entropy × critic.

An algorithm is not a class: it is an `AlgorithmConfig` (the `algorithm:` section of a train
config) whose parts name functions of `losses` (ALGORITHMS.md §5.2, §7.2, §7.4). `rl_loss`
composes them for one micro-batch:

    L = L_pg(logp, old_logp, A, m; agg)                  policy loss, IS weights if any
        + β·L_KL(logp, ref_logp, m; agg)                 kl.mode = "loss" (β from the KL controller)
        − c_H·aggregate(H, m; agg)                       entropy bonus
        + c_V·L_V(V, V_old, R, m; critic.agg)            critic (PPO)

The policy loss "online_dpo" is a preference loss instead (Online DPO, "Direct Language Model
Alignment from Online AI Feedback", arXiv 2402.04792; TRL's `OnlineDPOTrainer`): each prompt's
two samples form a pair (with `G > 2` samples, its best and worst: `online_dpo_select`), the
one with the higher advantage (so the higher reward, for the grouped estimators) is chosen, and
`losses.dpo_loss` compares their sequence log-prob sums with the reference's
(`online_dpo_pairs`); pairs with equal rewards are left out.

every term aggregated with the micro-batch's share of the *global* normalisers, so the loss of
an optimizer update is the sum of its micro-batches' losses. KL in the reward (kl.mode =
"reward") and the advantages themselves are computed before the update
(`jaxrl_llm.train.advantages`). `PRESETS` holds the named algorithms; `configs/<name>.yaml`
spells each one out.

Sources of the presets: GRPO — "DeepSeekMath" (arXiv 2402.03300); Dr.GRPO — "Understanding
R1-Zero-Like Training: A Critical Perspective" (arXiv 2503.20783); DAPO — arXiv 2503.14476;
GSPO — "Group Sequence Policy Optimization" (arXiv 2507.18071); CISPO — "MiniMax-M1"
(arXiv 2506.13585); SAPO — "Soft Adaptive Policy Optimization" (arXiv 2511.20347); RLOO —
"Back to Basics" (arXiv 2402.14740); REINFORCE++ — arXiv 2501.03262; PPO — arXiv 1707.06347
with the RLHF reward of "Fine-Tuning Language Models from Human Preferences" (arXiv 1909.08593).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp

import losses
from jaxrl_llm.train.batch import Normalizers, RLBatch, count_normalizers
from losses.aggregation import AggMode

Estimator = Literal["group", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"]
PolicyLossName = Literal["ppo_clip", "gspo", "cispo", "sapo", "gmpo", "reinforce", "online_dpo"]
GROUPED_ESTIMATORS = ("group", "rloo", "reinforce_pp_baseline")

# the fields of PolicyLossConfig each loss reads (the others must stay None)
_LOSS_FIELDS: dict[str, tuple[str, ...]] = {
    "ppo_clip": ("clip_low", "clip_high", "dual_clip", "ratio_cap", "agg", "norm_length"),
    "gspo": ("clip_low", "clip_high", "level", "agg", "norm_length"),
    "cispo": ("clip_low", "clip_high", "convention", "agg", "norm_length"),
    "sapo": ("tau_pos", "tau_neg", "agg", "norm_length"),
    "gmpo": ("clip_low", "clip_high", "agg"),
    "reinforce": ("agg", "norm_length"),
    "online_dpo": ("beta", "loss_type"),
}
# each loss's own default aggregation (used by the KL and entropy terms too, §7.4)
_DEFAULT_AGG = {
    "ppo_clip": "token_mean",
    "gspo": "seq_mean_token_mean",
    "cispo": "token_mean",
    "sapo": "seq_mean_token_mean",
    "gmpo": "seq_mean_token_mean",
    "reinforce": "token_mean",
    "online_dpo": "token_mean",  # of the entropy bonus; the loss itself is a mean over pairs
}
_ESTIMATOR_FIELDS: dict[str, tuple[str, ...]] = {
    "group": ("scale", "eps", "ddof"),
    "rloo": (),
    "reinforce_pp": ("gamma",),
    "reinforce_pp_baseline": (),
    "gae": ("gamma", "lam"),
}


def _unused_fields_at_default(cfg: Any, used: tuple[str, ...], owner: str, where: str) -> None:
    """Fields the chosen option does not read must keep their defaults (nothing silently ignored)."""
    for field in dataclasses.fields(cfg):
        if field.name in (*used, "name", "estimator"):
            continue
        if field.name in ("whiten", "drop_zero_variance"):
            continue
        if getattr(cfg, field.name) != field.default:
            raise ValueError(
                f"{where}: `{field.name}` is not used by {owner}; remove it (got "
                f"{getattr(cfg, field.name)!r})."
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdvantageConfig:
    """Advantage estimator (ALGORITHMS.md §4) and its options.

    Attributes:
      estimator: "group" (GRPO / Dr.GRPO / batch-std: `losses.group_advantages`), "rloo",
        "reinforce_pp" (`losses.reinforce_pp_advantages` of the token rewards),
        "reinforce_pp_baseline", or "gae" (needs a critic).
      scale: group estimator only: "group", "batch" or "none".
      eps: group estimator only: added to the std.
      ddof: group estimator only: 0 or 1.
      gamma: discount (reinforce_pp, gae).
      lam: GAE λ.
      whiten: whiten the token advantages over the batch (`losses.masked_whiten`; PPO).
      drop_zero_variance: groups whose rewards are all equal leave the loss (their rows'
        completion mask is zeroed: DAPO's dynamic-sampling filter, in-graph).

    Examples:
      >>> AdvantageConfig(estimator="gae", gamma=1.0, lam=0.95).lam
      0.95
      >>> AdvantageConfig(estimator="rloo", scale="none")
      Traceback (most recent call last):
      ...
      ValueError: AdvantageConfig: `scale` is not used by estimator 'rloo'; remove it (got 'none').
    """

    estimator: Estimator = "group"
    scale: Literal["group", "batch", "none"] = "group"
    eps: float = 1e-6
    ddof: int = 1
    gamma: float = 1.0
    lam: float = 1.0
    whiten: bool = False
    drop_zero_variance: bool = False

    def __post_init__(self) -> None:
        where = "AdvantageConfig"
        if self.estimator not in _ESTIMATOR_FIELDS:
            raise ValueError(
                f"{where}: `estimator` must be one of {', '.join(_ESTIMATOR_FIELDS)}, got "
                f"{self.estimator!r}."
            )
        _unused_fields_at_default(
            self, _ESTIMATOR_FIELDS[self.estimator], f"estimator {self.estimator!r}", where
        )
        if self.ddof not in (0, 1):
            raise ValueError(f"{where}: `ddof` must be 0 or 1, got {self.ddof!r}.")
        if not self.eps >= 0:  # NaN too
            raise ValueError(f"{where}: `eps` must be >= 0, got {self.eps!r}.")
        for key in ("gamma", "lam"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(
                    f"{where}: `{key}` must lie in [0, 1], got {getattr(self, key)!r}."
                )
        if self.whiten and self.estimator in ("reinforce_pp", "reinforce_pp_baseline"):
            raise ValueError(
                f"{where}: estimator {self.estimator!r} already whitens its advantages; "
                "remove `whiten`."
            )
        if self.drop_zero_variance and self.estimator not in GROUPED_ESTIMATORS:
            raise ValueError(
                f"{where}: `drop_zero_variance` needs a grouped estimator "
                f"({', '.join(GROUPED_ESTIMATORS)}), got {self.estimator!r}."
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyLossConfig:
    """The policy loss of `losses` and its keywords (None: the loss's own default).

    Attributes:
      name: "ppo_clip", "gspo", "cispo", "sapo", "gmpo", "reinforce" or "online_dpo".
      clip_low, clip_high: clip ranges (ppo_clip, gspo, cispo, gmpo).
      dual_clip, ratio_cap: ppo_clip only.
      level: gspo only ("sequence_token" or "sequence").
      convention: cispo only ("relative" or "absolute").
      tau_pos, tau_neg: sapo only.
      agg: aggregation mode of `losses.aggregate` (gmpo: only "seq_mean_token_mean").
      norm_length: constant divisor of "seq_mean_token_sum_norm" (None: the batch's `T`).
      beta: online_dpo only: DPO's `β` (None: 0.1, TRL's default).
      loss_type: online_dpo only: a `losses.dpo_loss` type (None: "sigmoid").

    Examples:
      >>> PolicyLossConfig(name="sapo").effective_agg
      'seq_mean_token_mean'
      >>> PolicyLossConfig(name="gspo", dual_clip=3.0)
      Traceback (most recent call last):
      ...
      ValueError: PolicyLossConfig: `dual_clip` is not used by loss 'gspo'; remove it (got 3.0).
    """

    name: PolicyLossName = "ppo_clip"
    clip_low: float | None = None
    clip_high: float | None = None
    dual_clip: float | None = None
    ratio_cap: float | None = None
    level: Literal["sequence_token", "sequence"] | None = None
    convention: Literal["relative", "absolute"] | None = None
    tau_pos: float | None = None
    tau_neg: float | None = None
    agg: AggMode | None = None
    norm_length: int | None = None
    beta: float | None = None
    loss_type: str | None = None

    def __post_init__(self) -> None:
        where = "PolicyLossConfig"
        if self.name not in _LOSS_FIELDS:
            raise ValueError(
                f"{where}: `name` must be one of {', '.join(_LOSS_FIELDS)}, got {self.name!r}."
            )
        _unused_fields_at_default(self, _LOSS_FIELDS[self.name], f"loss {self.name!r}", where)
        if self.agg is not None and self.agg not in losses.AGG_MODES:
            raise ValueError(
                f"{where}: `agg` must be one of {', '.join(losses.AGG_MODES)}, got {self.agg!r}."
            )
        if self.name == "gmpo" and self.agg not in (None, "seq_mean_token_mean"):
            raise ValueError(
                f"{where}: gmpo is a mean over sequences; `agg` must be 'seq_mean_token_mean', "
                f"got {self.agg!r}."
            )
        if self.norm_length is not None and self.effective_agg != "seq_mean_token_sum_norm":
            raise ValueError(
                f"{where}: `norm_length` is only used by agg 'seq_mean_token_sum_norm', got "
                f"agg={self.effective_agg!r}."
            )
        for key in ("clip_low", "clip_high", "tau_pos", "tau_neg"):
            value = getattr(self, key)
            if value is not None and value < 0:
                raise ValueError(f"{where}: `{key}` must be >= 0, got {value!r}.")
        if self.beta is not None and not self.beta > 0:
            raise ValueError(f"{where}: `beta` must be > 0, got {self.beta!r}.")
        if self.loss_type is not None and self.loss_type not in losses.DPO_LOSS_TYPES:
            raise ValueError(
                f"{where}: `loss_type` must be one of {', '.join(losses.DPO_LOSS_TYPES)}, got "
                f"{self.loss_type!r}."
            )
        if self.name == "online_dpo":
            self._dry_run_online_dpo(where)

    def _dry_run_online_dpo(self, where: str) -> None:
        """Trace online DPO's `dpo_loss` call on dummy pairs, so a loss type that needs a
        setting online DPO does not have (exo_pair's label smoothing) fails at load time."""
        z = jax.ShapeDtypeStruct((2,), jnp.float32)  # abstract: no device, no backend start-up
        beta = 0.1 if self.beta is None else self.beta
        loss_type = self.loss_type or "sigmoid"
        try:
            jax.eval_shape(
                lambda c, r: losses.dpo_loss(c, r, c, r, beta=beta, loss_type=loss_type), z, z
            )
        except ValueError as error:
            raise ValueError(
                f"{where}: online DPO (beta and loss_type only) cannot run loss_type "
                f"{self.loss_type!r}: {error}"
            ) from None

    @property
    def effective_agg(self) -> str:
        """`agg`, or the loss's default aggregation when it is None."""
        return self.agg or _DEFAULT_AGG[self.name]

    @property
    def takes_norm_length(self) -> bool:
        """Whether the loss has a `norm_length` field (its `seq_mean_token_sum_norm` constant)."""
        return "norm_length" in _LOSS_FIELDS[self.name]

    def kwargs(self) -> dict[str, Any]:
        """The keywords passed to the `losses` function (set fields only)."""
        out = {}
        for key in _LOSS_FIELDS[self.name]:
            value = getattr(self, key)
            if value is not None and key != "norm_length":
                out[key] = value
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class KLConfig:
    """KL regularisation to the reference policy (ALGORITHMS.md §3).

    Attributes:
      mode: "none", "loss" (`β·losses.kl_loss`) or "reward" (`losses.kl_penalized_rewards`
        before GAE / REINFORCE++; `losses.kl_penalized_scores` for group estimators).
      coef: the initial coefficient β (> 0 unless mode is "none").
      estimator: "k1", "k2", "k3" or "abs"; None: k3 as a loss, k1 in the reward (§3.4). As a
        loss, k3's value is clamped to ±10 (verl's `low_var_kl`); k2 and abs are not (verl's
        `mse` and `abs`: a clamp would zero the gradient of the most-drifted tokens).
      target: with a value, β follows the adaptive controller (`losses.adaptive_kl_update`,
        KL measured as k1 between the batch's old and reference log-probs); None: fixed β.
      horizon: the adaptive controller's horizon (samples; None: `losses.adaptive_kl_controller`'s
        10000); read only with a `target`, so it is refused without one.

    Examples:
      >>> KLConfig(mode="loss", coef=0.04).resolved_estimator
      'k3'
      >>> KLConfig(mode="reward", coef=0.05).resolved_estimator
      'k1'
    """

    mode: Literal["none", "loss", "reward"] = "none"
    coef: float = 0.0
    estimator: Literal["k1", "k2", "k3", "abs"] | None = None
    target: float | None = None
    horizon: float | None = None

    def __post_init__(self) -> None:
        where = "KLConfig"
        if self.mode not in ("none", "loss", "reward"):
            raise ValueError(
                f"{where}: `mode` must be 'none', 'loss' or 'reward', got {self.mode!r}."
            )
        if self.mode == "none":
            if self.coef != 0.0 or self.estimator is not None or self.target is not None:
                raise ValueError(
                    f"{where}: mode='none' takes no `coef`, `estimator` or `target` (got "
                    f"coef={self.coef!r}, estimator={self.estimator!r}, target={self.target!r})."
                )
        elif not self.coef > 0:
            raise ValueError(f"{where}: mode={self.mode!r} needs `coef` > 0, got {self.coef!r}.")
        if self.target is not None and not self.target > 0:
            raise ValueError(f"{where}: `target` must be > 0 or null, got {self.target!r}.")
        if self.horizon is not None and self.target is None:
            raise ValueError(
                f"{where}: `horizon` is read only by the adaptive controller; set `target` too, "
                f"or remove it (got horizon={self.horizon!r})."
            )
        if self.horizon is not None and not self.horizon > 0:
            raise ValueError(f"{where}: `horizon` must be > 0, got {self.horizon!r}.")
        if self.mode == "loss" and self.estimator == "k1":
            raise ValueError(
                f"{where}: k1 has a zero-mean gradient and is no KL loss (ALGORITHMS.md §3.4); "
                "use k2, k3 or abs."
            )

    @property
    def resolved_estimator(self) -> str:
        """The estimator in use (k3 as a loss, k1 in the reward when `estimator` is None)."""
        if self.estimator is not None:
            return self.estimator
        return "k1" if self.mode == "reward" else "k3"

    @property
    def loss_clamp(self) -> float | None:
        """The `clamp` of `losses.kl_loss` in mode "loss": 10 for k3 (verl), else None."""
        return 10.0 if self.resolved_estimator == "k3" else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class CriticConfig:
    """PPO's critic (ALGORITHMS.md §7).

    Attributes:
      kind: "model" (a separate `ValueModel`) or "head" (a `ValueHead` on the policy's hidden
        states; the value loss then also trains the shared backbone).
      coef: c_V, the weight of the value loss in the total loss. With Adam-type optimizers a
        separate critic's step does not change with it (only through the joint gradient clip,
        `optim.max_grad_norm`); with a head it weighs the value gradient in the shared backbone
        (docs/training.md, "Critic"). `optim.critic_learning_rate` sets the critic's own rate
        and clip.
      clip: value clip range (None: unclipped ½ MSE).
      agg: aggregation mode of the value loss.

    Examples:
      >>> CriticConfig(kind="head", coef=0.1).clip
      0.2
    """

    kind: Literal["model", "head"] = "model"
    coef: float = 0.1
    clip: float | None = 0.2
    agg: AggMode = "token_mean"

    def __post_init__(self) -> None:
        where = "CriticConfig"
        if self.kind not in ("model", "head"):
            raise ValueError(f"{where}: `kind` must be 'model' or 'head', got {self.kind!r}.")
        if not self.coef > 0:
            raise ValueError(f"{where}: `coef` must be > 0, got {self.coef!r}.")
        if self.clip is not None and not self.clip > 0:
            raise ValueError(f"{where}: `clip` must be > 0 or null, got {self.clip!r}.")
        if self.agg not in losses.AGG_MODES:
            raise ValueError(
                f"{where}: `agg` must be one of {', '.join(losses.AGG_MODES)}, got {self.agg!r}."
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutCorrectionConfig:
    """Importance weights for the sampler/trainer mismatch (`losses.rollout_correction_weights`).

    The batch must carry `rollout_logp` (the sampler's behaviour log-probs); the weights
    `w(π_old/π_rollout)` multiply the policy loss (ALGORITHMS.md §6.1).

    Examples:
      >>> RolloutCorrectionConfig(level="sequence", mode="mask", high=3.0).level
      'sequence'
    """

    level: Literal["token", "sequence", "geometric"] = "token"
    mode: Literal["truncate", "mask"] = "truncate"
    low: float | None = None
    high: float | None = 2.0

    def __post_init__(self) -> None:
        where = "RolloutCorrectionConfig"
        if self.low is not None and not self.low >= 0:
            raise ValueError(f"{where}: `low` must be >= 0, got {self.low!r}.")
        if self.high is not None and not self.high > 0:  # 0 would zero every weight: no update
            raise ValueError(f"{where}: `high` must be > 0, got {self.high!r}.")
        if self.low is not None and self.high is not None and not self.low < self.high:
            raise ValueError(f"{where}: `low` ({self.low!r}) must be below `high` ({self.high!r}).")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AlgorithmConfig:
    """The `algorithm:` section of a train config (see the module docstring).

    Attributes:
      name: a label for logs (the presets use their own names).
      advantage: the advantage estimator.
      policy_loss: the policy loss.
      kl: KL regularisation.
      critic: PPO's critic (required by, and only by, the "gae" estimator).
      rollout_correction: importance weights against the sampler's log-probs (None: off).
      entropy_coef: c_H ≥ 0, weight of the entropy bonus.
      temperature: the sampling temperature τ of every log-prob (must match the sampler).
      epochs: passes over one rollout batch (PPO-style reuse).
      minibatches: optimizer updates per epoch (the batch is split into this many parts).
      shuffle: reshuffle the rows every epoch (only matters with `minibatches > 1`).
      minibatch_unit: what minibatches and micro-batches are made of: "row" (default: rows
        `m, m + M, …` whatever their prompt) or "prompt" (each prompt's `G` rows together,
        whole prompts `m, m + M, …`, shuffled as groups; verl's minibatches of whole
        prompts). With "prompt" the update keeps the shared-prompt forward
        (`train.shared_prompt_forward`) under any number of minibatches and micro-batches,
        and the step's prompts must split into them.
      chunk_size: positions per vocabulary chunk of the log-prob forward (None: all at once).
      old_logprobs: where the batch's old (sampling) policy log-probs come from when the
        algorithm reads them (`needs_old_logprobs`: an update that reuses its batch, or a KL
        in the reward): "forward" (default: a forward of the policy over the rollout before
        the update) or "sampler" (the sampler's own log-probs of the tokens it drew,
        unfiltered at the temperature τ: the same policy and parameters, so equal to the
        forward's up to float rounding, and one forward per step fewer; verl's and slime's
        rollout log-probs without recomputation). Keep "forward" where the sampler's
        numerics differ from training by more than rounding (another dtype or engine). With
        "sampler", `rollout_correction` compares the sampler with itself and corrects only
        its top-k / top-p / min-p filters (a run config refuses the pair without a filter).

    Examples:
      >>> cfg = AlgorithmConfig(advantage=AdvantageConfig(estimator="gae", lam=0.95),
      ...                       critic=CriticConfig(kind="head"))
      >>> cfg.critic.kind
      'head'
      >>> AlgorithmConfig(advantage=AdvantageConfig(estimator="gae"))
      Traceback (most recent call last):
      ...
      ValueError: AlgorithmConfig: the 'gae' estimator needs a `critic`, and a `critic` needs 'gae' (got estimator='gae', critic=None).
    """

    name: str = "custom"
    advantage: AdvantageConfig = dataclasses.field(default_factory=AdvantageConfig)
    policy_loss: PolicyLossConfig = dataclasses.field(default_factory=PolicyLossConfig)
    kl: KLConfig = dataclasses.field(default_factory=KLConfig)
    critic: CriticConfig | None = None
    rollout_correction: RolloutCorrectionConfig | None = None
    entropy_coef: float = 0.0
    temperature: float = 1.0
    epochs: int = 1
    minibatches: int = 1
    shuffle: bool = True
    minibatch_unit: Literal["row", "prompt"] = "row"
    chunk_size: int | None = None
    old_logprobs: Literal["forward", "sampler"] = "forward"

    def __post_init__(self) -> None:
        where = "AlgorithmConfig"
        if self.minibatch_unit not in ("row", "prompt"):
            raise ValueError(
                f"{where}: `minibatch_unit` must be 'row' or 'prompt', got {self.minibatch_unit!r}."
            )
        estimator = self.advantage.estimator
        if (estimator == "gae") != (self.critic is not None):
            raise ValueError(
                f"{where}: the 'gae' estimator needs a `critic`, and a `critic` needs 'gae' (got "
                f"estimator={estimator!r}, critic={self.critic!r})."
            )
        if self.kl.mode == "reward":
            if estimator == "reinforce_pp_baseline":
                raise ValueError(
                    f"{where}: kl.mode='reward' is not defined for 'reinforce_pp_baseline' "
                    "(its scores are whitened over tokens); use kl.mode='loss'."
                )
            if estimator in ("group", "rloo") and self.kl.resolved_estimator != "k1":
                raise ValueError(
                    f"{where}: KL in the sequence reward of {estimator!r} is the k1 sum "
                    f"(losses.kl_penalized_scores); got kl.estimator={self.kl.estimator!r}."
                )
        if not self.entropy_coef >= 0:
            raise ValueError(f"{where}: `entropy_coef` must be >= 0, got {self.entropy_coef!r}.")
        if not self.temperature > 0:
            raise ValueError(f"{where}: `temperature` must be > 0, got {self.temperature!r}.")
        for key in ("epochs", "minibatches"):
            if getattr(self, key) < 1:
                raise ValueError(f"{where}: `{key}` must be >= 1, got {getattr(self, key)!r}.")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(
                f"{where}: `chunk_size` must be >= 1 or null, got {self.chunk_size!r}."
            )
        if self.old_logprobs not in ("forward", "sampler"):
            raise ValueError(
                f"{where}: `old_logprobs` must be 'forward' or 'sampler', got "
                f"{self.old_logprobs!r}."
            )
        if self.policy_loss.name == "online_dpo":
            self._check_online_dpo(where)

    def _check_online_dpo(self, where: str) -> None:
        """Online DPO reads pairs of whole sequences: the settings that change that refuse."""
        problems = []
        if self.advantage.estimator not in GROUPED_ESTIMATORS:
            problems.append(
                f"a grouped advantage estimator ({', '.join(GROUPED_ESTIMATORS)}) to rank each "
                f"pair, got {self.advantage.estimator!r}"
            )
        if self.kl.mode != "none":
            problems.append("kl.mode 'none' (β already ties the policy to the reference)")
        if self.rollout_correction is not None:
            problems.append("no rollout_correction")
        if problems:
            raise ValueError(f"{where}: policy_loss 'online_dpo' needs " + "; ".join(problems))

    def update_unit(self, samples_per_prompt: int) -> int:
        """Consecutive rows of a prompt-major batch that the update keeps in one micro-batch
        (`Objective.row_unit`): online DPO's pair (2), a prompt's `G` rows with
        `minibatch_unit: prompt`, else 1.

        Examples:
          >>> AlgorithmConfig(minibatch_unit="prompt").update_unit(8), AlgorithmConfig().update_unit(8)
          (8, 1)
        """
        if self.policy_loss.name == "online_dpo":
            return 2
        return samples_per_prompt if self.minibatch_unit == "prompt" else 1

    @property
    def needs_old_logprobs(self) -> bool:
        """Whether the batch needs the sampling policy's log-probs from a forward before the
        update: the ratio of an update that reuses its batch (`epochs × minibatches > 1`), or
        a KL in the reward. Online DPO's loss has no ratio."""
        reuses_batch = self.epochs * self.minibatches > 1 and self.policy_loss.name != "online_dpo"
        return reuses_batch or self.kl.mode == "reward"

    @property
    def needs_reference(self) -> bool:
        """Whether the batch needs the reference's log-probs: a KL term, or online DPO."""
        return self.kl.mode != "none" or self.policy_loss.name == "online_dpo"


def kl_controller(config: KLConfig) -> losses.KLController:
    """The KL coefficient controller of `config`: adaptive when `target` is set, else fixed.

    Examples:
      >>> ctrl = kl_controller(KLConfig(mode="reward", coef=0.001, target=0.1))
      >>> round(float(ctrl.update(ctrl.init(), 0.15, 256).beta), 8)
      0.00100512
    """
    if config.target is None:
        return losses.fixed_kl_controller(config.coef)
    horizon = {} if config.horizon is None else {"horizon": config.horizon}  # None: the default
    return losses.adaptive_kl_controller(config.coef, target=config.target, **horizon)


def _policy_loss_fn(config: PolicyLossConfig) -> Callable[..., tuple[jax.Array, dict]]:
    fn = {
        "ppo_clip": losses.ppo_clip_loss,
        "gspo": losses.gspo_loss,
        "cispo": losses.cispo_loss,
        "sapo": losses.sapo_loss,
        "gmpo": losses.gmpo_loss,
    }.get(config.name)
    kwargs = config.kwargs()
    if config.name == "gmpo":
        kwargs.pop("agg", None)
        return lambda lp, old, adv, m, *, num_tokens, num_seqs, norm_length, is_weights: fn(
            lp, old, adv, m, num_seqs=num_seqs, is_weights=is_weights, **kwargs
        )
    if config.name == "reinforce":
        return lambda lp, old, adv, m, **kw: losses.reinforce_loss(lp, adv, m, **kw, **kwargs)
    return lambda lp, old, adv, m, **kw: fn(lp, old, adv, m, **kw, **kwargs)


def _row_scores(advantages: jax.Array, mask: jax.Array) -> jax.Array:
    """Online DPO's rank of a row: its mean advantage over its valid tokens (0 for none)."""
    m = (mask > 0).astype(jnp.float32)
    return jnp.sum(jnp.where(m > 0, advantages, 0.0), axis=1) / jnp.maximum(m.sum(axis=1), 1.0)


def online_dpo_pairs(advantages: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`(first_chosen[B], valid[B])` of rows that come in pairs (rows `2b`, `2b + 1`: a prompt's
    two samples, or its best and worst of more, `online_dpo_select`): each row is scored by its
    mean advantage over its tokens; the higher one is chosen, and a pair with equal scores
    (equal rewards) is not valid.

    Examples:
      >>> adv = jnp.array([[1.0, 1.0], [-1.0, -1.0], [0.0, 0.0], [0.0, 0.0]])
      >>> first, valid = online_dpo_pairs(adv, jnp.ones((4, 2)))
      >>> first.tolist(), valid.tolist()
      ([True, False], [True, False])
    """
    if advantages.shape[0] % 2:
        raise ValueError(
            f"online_dpo_pairs: the rows come in pairs, got N = {advantages.shape[0]} rows."
        )
    pairs = _row_scores(advantages, mask).reshape(-1, 2)
    return pairs[:, 0] > pairs[:, 1], pairs[:, 0] != pairs[:, 1]


def online_dpo_select(batch: RLBatch, group_size: int) -> RLBatch:
    """The rows of online DPO's pairs: each group's best and worst sample, as consecutive rows.

    The batch is prompt-major (rows `b·G .. b·G + G − 1` are prompt `b`'s samples). Each row is
    scored by its mean advantage over its tokens (as in `online_dpo_pairs`); the group's first
    row of the highest score and its first row of the lowest score become rows `2b` and
    `2b + 1` of the result, every field of the batch gathered alike. This is the best-against-
    worst pairing of online iterative RLHF ("RLHF Workflow: From Reward Modeling to Online
    RLHF", arXiv 2405.07863). A group whose scores are all equal gives one row twice: a tied
    pair, which `online_dpo_pairs` leaves out. With `G = 2` the pairs are the groups.

    Args:
      batch: `N = B·G` rows.
      group_size: `G >= 2`.

    Returns:
      The `2B`-row batch.

    Examples:
      >>> adv = jnp.array([[0.0], [1.0], [-1.0], [0.5], [0.0], [0.0], [0.0], [0.0]])
      >>> b = RLBatch(jnp.arange(8)[:, None], jnp.ones((8, 1)), jnp.ones((8, 1)), adv)
      >>> online_dpo_select(b, 4).tokens[:, 0].tolist()  # group 2 is tied: row 4 twice
      [1, 2, 4, 4]
    """
    N = batch.completion_mask.shape[0]
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
        raise ValueError(
            f"online_dpo_select: `group_size` must be an int >= 2, got {group_size!r}."
        )
    if N % group_size:
        raise ValueError(
            f"online_dpo_select: N = {N} rows are not whole groups of group_size = {group_size}."
        )
    groups = _row_scores(batch.advantages, batch.completion_mask).reshape(-1, group_size)
    first = jnp.arange(0, N, group_size, dtype=jnp.int32)
    rows = jnp.stack([first + jnp.argmax(groups, axis=1), first + jnp.argmin(groups, axis=1)], 1)
    rows = rows.reshape(-1)
    return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), batch)


def keeps_row_subset(config: AlgorithmConfig, group_size: int) -> bool:
    """Whether `build_rl_batch` keeps only some of a rollout's rows: online DPO with more than
    two samples per prompt keeps each prompt's best and worst (`online_dpo_select`). The
    reference forward then runs on the kept `2N/G` rows only, after `build_rl_batch` (called
    without `ref_logp`): the caller sets `batch.ref_logp` on the returned batch.

    Examples:
      >>> keeps_row_subset(preset("online_dpo"), 4), keeps_row_subset(preset("online_dpo"), 2)
      (True, False)
      >>> keeps_row_subset(preset("grpo"), 8)
      False
    """
    return config.policy_loss.name == "online_dpo" and group_size > 2


def online_dpo_normalizers(batch: RLBatch) -> Normalizers:
    """`count_normalizers` with `num_seqs` = the valid pairs of `online_dpo_pairs` (the DPO
    mean's denominator, global over the update like every count).

    Examples:
      >>> adv = jnp.array([[1.0], [-1.0], [0.0], [0.0]])
      >>> b = RLBatch(jnp.zeros((4, 2), jnp.int32), jnp.ones((4, 2)), jnp.ones((4, 1)), adv)
      >>> float(online_dpo_normalizers(b).num_seqs)
      1.0
    """
    counts = count_normalizers(batch.completion_mask)
    _, valid = online_dpo_pairs(batch.advantages, batch.completion_mask)
    return counts._replace(num_seqs=jnp.sum(valid.astype(jnp.float32)))


def _online_dpo_loss(
    config: PolicyLossConfig, batch: RLBatch, logp: jax.Array, mask: jax.Array, norms: Normalizers
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """DPO on each prompt's pair of samples (module docstring), averaged over the update's
    valid pairs (`norms.num_seqs`, from `online_dpo_normalizers`)."""
    if batch.ref_logp is None:
        raise ValueError("rl_loss: policy_loss 'online_dpo' needs `batch.ref_logp`.")
    first, valid = online_dpo_pairs(batch.advantages, mask)

    def chosen_and_rejected(per_token: jax.Array) -> tuple[jax.Array, jax.Array]:
        seq = jnp.sum(jnp.where(mask > 0, per_token, 0.0), axis=1).reshape(-1, 2)
        return jnp.where(first, seq[:, 0], seq[:, 1]), jnp.where(first, seq[:, 1], seq[:, 0])

    chosen, rejected = chosen_and_rejected(logp)
    ref_chosen, ref_rejected = chosen_and_rejected(batch.ref_logp)
    loss, metrics = losses.dpo_loss(
        chosen,
        rejected,
        ref_chosen,
        ref_rejected,
        beta=0.1 if config.beta is None else config.beta,
        loss_type=config.loss_type or "sigmoid",
        valid=valid.astype(jnp.float32),
        num_pairs=jnp.maximum(norms.num_seqs, 1.0),
    )
    return loss, dict(metrics)


def _seq_k1(old_logp: jax.Array, ref_logp: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean over this micro-batch's sequences of the per-sequence masked mean of `old − ref`."""
    valid = mask > 0
    d = jnp.where(valid, old_logp - ref_logp, 0.0)
    lengths = jnp.sum(mask, axis=1)
    per_seq = jnp.sum(d, axis=1) / jnp.maximum(lengths, 1.0)
    rows = lengths > 0
    return jnp.sum(jnp.where(rows, per_seq, 0.0)) / jnp.maximum(jnp.sum(rows), 1.0)


def rl_loss(
    config: AlgorithmConfig,
    batch: RLBatch,
    norms: Normalizers,
    *,
    logp: jax.Array,
    entropy: jax.Array,
    values: jax.Array | None = None,
    kl_coef: jax.Array | float = 0.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The composed RL loss of one micro-batch (see the module docstring), and its metrics.

    Args:
      config: the algorithm.
      batch: the micro-batch (`old_logp` None: on-policy, `stop_gradient(logp)`).
      norms: global normalisers of the optimizer update this micro-batch belongs to.
      logp: `[N,T]` log-probs of the current policy (differentiable).
      entropy: `[N,T]` entropies of the current policy.
      values: `[N,T]` critic values (critic configs only).
      kl_coef: β of the KL loss (the KL controller's state).

    Returns:
      `(loss, metrics)`: the loss is *not* multiplied by `norms.grad_scale`. Metrics: the
      loss's own (`policy/…`, `kl/…`, `value/…`), `entropy/mean`, `kl/seq_k1` (k1 KL between
      old and reference policy, the adaptive controller's input) and the loss parts `loss/…`.

    Examples:
      >>> import jax.numpy as jnp
      >>> from jaxrl_llm.train.batch import count_normalizers
      >>> m = jnp.array([[1.0, 1.0, 0.0]]); lp = jnp.log(jnp.array([[0.5, 0.25, 1.0]]))
      >>> b = RLBatch(jnp.zeros((1, 4), jnp.int32), jnp.ones((1, 4)), m,
      ...             advantages=jnp.array([[1.0, 1.0, 0.0]]), old_logp=lp)
      >>> loss, metrics = rl_loss(AlgorithmConfig(), b, count_normalizers(m), logp=lp,
      ...                         entropy=jnp.zeros((1, 3)))
      >>> float(loss), float(metrics["policy/ratio_mean"])
      (-1.0, 1.0)
    """
    mask = (batch.completion_mask > 0).astype(jnp.float32)
    agg = config.policy_loss.effective_agg
    agg_kw = {
        "num_tokens": jnp.maximum(norms.num_tokens, 1.0),
        "num_seqs": jnp.maximum(norms.num_seqs, 1.0),
        "norm_length": config.policy_loss.norm_length,
    }
    old = batch.old_logp
    is_weights = None
    if config.rollout_correction is not None:
        rc = config.rollout_correction
        if batch.rollout_logp is None:
            raise ValueError("rl_loss: `rollout_correction` needs `batch.rollout_logp`.")
        old_for_is = jax.lax.stop_gradient(logp) if old is None else old
        is_weights = losses.rollout_correction_weights(
            old_for_is,
            batch.rollout_logp,
            mask,
            level=rc.level,
            mode=rc.mode,
            low=rc.low,
            high=rc.high,
        )
    if config.policy_loss.name == "online_dpo":
        pg, metrics = _online_dpo_loss(config.policy_loss, batch, logp, mask, norms)
    else:
        pg, metrics = _policy_loss_fn(config.policy_loss)(
            logp, old, batch.advantages, mask, is_weights=is_weights, **agg_kw
        )
    metrics = dict(metrics)
    parts = {"loss/policy": pg}
    total = pg
    if config.kl.mode != "none":
        if batch.ref_logp is None:
            raise ValueError(f"rl_loss: kl.mode={config.kl.mode!r} needs `batch.ref_logp`.")
        old_sg = jax.lax.stop_gradient(logp) if old is None else old
        metrics["kl/seq_k1"] = jax.lax.stop_gradient(_seq_k1(old_sg, batch.ref_logp, mask))
    if config.kl.mode == "loss":
        kl, kl_metrics = losses.kl_loss(
            logp,
            batch.ref_logp,
            mask,
            estimator=config.kl.resolved_estimator,
            clamp=config.kl.loss_clamp,
            agg=agg,
            **agg_kw,
        )
        metrics.update(kl_metrics)
        parts["loss/kl"] = kl
        total = total + jnp.asarray(kl_coef, jnp.float32) * kl
    ent = losses.aggregate(entropy, mask, mode=agg, **agg_kw)
    metrics["entropy/mean"] = jax.lax.stop_gradient(losses.masked_mean(entropy, mask))
    if config.entropy_coef > 0:
        parts["loss/entropy"] = ent
        total = total - config.entropy_coef * ent
    if config.critic is not None:
        if values is None or batch.returns is None:
            raise ValueError("rl_loss: a critic needs `values` and `batch.returns`.")
        if config.critic.clip is not None and batch.old_values is None:
            raise ValueError("rl_loss: value clipping needs `batch.old_values`.")
        vl, v_metrics = losses.value_loss(
            values,
            batch.old_values,
            batch.returns,
            mask,
            clip=config.critic.clip,
            agg=config.critic.agg,
            num_tokens=agg_kw["num_tokens"],
            num_seqs=agg_kw["num_seqs"],
        )
        v_metrics.pop("value/explained_var")  # not additive over micro-batches; see advantages
        metrics.update(v_metrics)
        parts["loss/value"] = vl
        total = total + config.critic.coef * vl
    parts["loss/total"] = total
    metrics.update({k: jax.lax.stop_gradient(v) for k, v in parts.items()})
    return total, metrics


def _preset(name: str, **kw: Any) -> AlgorithmConfig:
    return AlgorithmConfig(name=name, **kw)


PRESETS: dict[str, AlgorithmConfig] = {
    # DeepSeekMath: group-normalised advantages, PPO clip, per-sequence mean, k3 KL loss 0.04
    "grpo": _preset(
        "grpo",
        policy_loss=PolicyLossConfig(clip_low=0.2, clip_high=0.2, agg="seq_mean_token_mean"),
        kl=KLConfig(mode="loss", coef=0.04, estimator="k3"),
    ),
    # Dr.GRPO: no std scaling, constant length normaliser (the max completion length T), no KL
    "dr_grpo": _preset(
        "dr_grpo",
        advantage=AdvantageConfig(scale="none"),
        policy_loss=PolicyLossConfig(agg="seq_mean_token_sum_norm"),
    ),
    # DAPO: clip-higher, global token mean, zero-variance groups dropped, no KL
    "dapo": _preset(
        "dapo",
        advantage=AdvantageConfig(drop_zero_variance=True),
        policy_loss=PolicyLossConfig(clip_low=0.2, clip_high=0.28, agg="token_mean"),
    ),
    # GSPO: sequence-level ratio with the paper's clip range
    "gspo": _preset(
        "gspo",
        policy_loss=PolicyLossConfig(
            name="gspo", clip_low=3e-4, clip_high=4e-4, agg="seq_mean_token_mean"
        ),
    ),
    # CISPO: clipped stop-gradient IS weight in [0, 5], token mean
    "cispo": _preset(
        "cispo",
        policy_loss=PolicyLossConfig(name="cispo", clip_low=1.0, clip_high=4.0, agg="token_mean"),
    ),
    # SAPO: soft gate, per-sequence mean
    "sapo": _preset(
        "sapo",
        policy_loss=PolicyLossConfig(
            name="sapo", tau_pos=1.0, tau_neg=1.05, agg="seq_mean_token_mean"
        ),
    ),
    # RLOO: leave-one-out baseline, PPO clip, token mean, no reference model
    "rloo": _preset(
        "rloo",
        advantage=AdvantageConfig(estimator="rloo"),
        policy_loss=PolicyLossConfig(agg="token_mean"),
    ),
    # REINFORCE++: k1 KL in the token reward, whitened discounted returns (OpenRLHF β 0.01)
    "reinforce_pp": _preset(
        "reinforce_pp",
        advantage=AdvantageConfig(estimator="reinforce_pp", gamma=1.0),
        policy_loss=PolicyLossConfig(agg="token_mean"),
        kl=KLConfig(mode="reward", coef=0.01, estimator="k1"),
    ),
    # REINFORCE++-baseline: group mean baseline whitened over tokens, k2 KL loss 0.001 (verl)
    "reinforce_pp_baseline": _preset(
        "reinforce_pp_baseline",
        advantage=AdvantageConfig(estimator="reinforce_pp_baseline"),
        policy_loss=PolicyLossConfig(agg="token_mean"),
        kl=KLConfig(mode="loss", coef=0.001, estimator="k2"),
    ),
    # PPO (RLHF, TRL's defaults but the score on the last valid token, not the first padding
    # slot): k1 KL in the reward β 0.05, GAE λ 0.95, whitened advantages, separate critic with
    # clipped value loss (c_V 0.1, clip 0.2), 4 epochs per batch
    "ppo": _preset(
        "ppo",
        advantage=AdvantageConfig(estimator="gae", gamma=1.0, lam=0.95, whiten=True),
        policy_loss=PolicyLossConfig(clip_low=0.2, clip_high=0.2, agg="token_mean"),
        kl=KLConfig(mode="reward", coef=0.05, estimator="k1"),
        critic=CriticConfig(kind="model", coef=0.1, clip=0.2),
        epochs=4,
    ),
    # Online DPO (arXiv 2402.04792; TRL OnlineDPOTrainer): 2 samples per prompt ranked by the
    # reward, sigmoid DPO loss with β 0.1 against the initial policy, one update per batch
    "online_dpo": _preset(
        "online_dpo",
        advantage=AdvantageConfig(scale="none"),
        policy_loss=PolicyLossConfig(name="online_dpo", beta=0.1, loss_type="sigmoid"),
    ),
}


def preset(name: str) -> AlgorithmConfig:
    """The named algorithm of `PRESETS`.

    Examples:
      >>> preset("dapo").policy_loss.clip_high
      0.28
      >>> preset("grpo_v2")
      Traceback (most recent call last):
      ...
      ValueError: preset: unknown algorithm 'grpo_v2'; known: cispo, dapo, dr_grpo, grpo, gspo, online_dpo, ppo, reinforce_pp, reinforce_pp_baseline, rloo, sapo.
    """
    if name not in PRESETS:
        raise ValueError(
            f"preset: unknown algorithm {name!r}; known: {', '.join(sorted(PRESETS))}."
        )
    return PRESETS[name]
