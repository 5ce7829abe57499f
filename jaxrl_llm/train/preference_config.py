"""The `preference:` section of a run: which preference loss, its keywords, the step's shape.

`PreferenceConfig` is validated when it is built: every option a loss does not read must stay
unset, and the loss is traced once on dummy pairs so its own static checks run at load time.
The losses and their formulas: `jaxrl_llm.train.preference` and ALGORITHMS.md §8.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import jax
import jax.numpy as jnp

import losses
from losses.aggregation import AggMode

PreferenceLoss = Literal["dpo", "rpo", "simpo", "cpo", "orpo", "kto", "bco"]
FDivergence = Literal["reverse_kl", "forward_kl", "js_divergence", "alpha_divergence"]

# the options each loss reads; every other option must stay unset (None)
_LOSS_FIELDS: dict[str, tuple[str, ...]] = {
    "dpo": (
        "beta",
        "loss_type",
        "loss_weights",
        "label_smoothing",
        "reference_free",
        "f_divergence",
        "f_alpha",
        "discopop_tau",
        "normalize_by_length",
        "ld_alpha",
    ),
    "simpo": ("beta", "gamma", "label_smoothing", "alpha", "average_logprobs"),
    "cpo": ("beta", "loss_type", "label_smoothing", "nll_coef", "nll_agg", "average_logprobs"),
    "orpo": ("beta", "nll_coef", "nll_agg", "average_logprobs"),
    "kto": ("beta", "loss_type", "desirable_weight", "undesirable_weight"),
    "bco": ("beta",),
}
_LOSS_FIELDS["rpo"] = (*_LOSS_FIELDS["dpo"], "nll_coef", "nll_agg")
_STEP_FIELDS = (
    "loss",
    "epochs",
    "minibatches",
    "shuffle",
    "chunk_size",
    "shared_prompt",
    "precompute_reference",
    "packing",
    "packing_length",
)
# losses defined on length-averaged log-probs by their papers (`average_logprobs` default)
_AVERAGED_BY_DEFAULT = {"simpo": True, "orpo": True, "cpo": False}
_NLL_LOSSES = ("rpo", "cpo", "orpo")
_DEFAULT_NLL_COEF = 1.0  # TRL's rpo_alpha / cpo_alpha; ORPO's objective weights the NLL by 1
_LENGTH_TYPES = ("ipo", "sigmoid_norm")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreferenceConfig:
    """The `preference:` section: which preference loss, its keywords, and the step's shape.

    Options the chosen `loss` does not read must stay unset (None), as in `AlgorithmConfig`;
    an unset option takes the loss function's own default. Every static check of the loss
    itself (e.g. `exo_pair` needs `0 < label_smoothing < 1`) also runs here, at load time.

    Attributes:
      loss: "dpo" (`losses.dpo_loss`), "rpo" (`losses.rpo_loss`: DPO + NLL of the chosen),
        "simpo", "cpo" (+ NLL), "orpo" (+ NLL), "kto" (unpaired labelled data) or "bco"
        (`losses.bco_loss` on pairs, with the running reward mean δ).
      beta: β of the loss (None: its default — 0.1, SimPO 2.0).
      loss_type: dpo/rpo: a name of `losses.DPO_LOSS_TYPES` or a list of them (weighted sum);
        cpo: "sigmoid", "hinge" or "ipo"; kto: "kto" or "apo_zero_unpaired".
      loss_weights: dpo/rpo with a list `loss_type`: one weight per type (MPO: 0.8, 0.2).
      label_smoothing: ε (dpo/rpo types that read it, simpo, cpo sigmoid).
      reference_free: dpo/rpo: `ref ≡ 0` (no reference forward).
      f_divergence, f_alpha, discopop_tau: dpo/rpo scores and DiscoPOP's τ.
      normalize_by_length: dpo/rpo with "ipo" or "sigmoid_norm": pass the completion lengths
        (TRL's length-normalised IPO).
      ld_alpha: dpo/rpo: LD-DPO's weight α ∈ [0, 1] of the tokens beyond the shorter response
        (`losses.ld_sequence_logprob`, policy and reference alike).
      gamma: simpo: target margin γ (default 0.5).
      alpha: simpo: AlphaPO's reward-shape α (default 0: SimPO).
      average_logprobs: simpo/orpo/cpo: length-averaged sequence log-probs
        (`sequence_logprob(reduce="mean")`); default True for simpo and orpo (their papers),
        False for cpo (TRL feeds averages to cpo's ipo: set it True).
      nll_coef: rpo/cpo/orpo: weight of the NLL of the chosen tokens (default 1.0).
      nll_agg: rpo/cpo/orpo: aggregation of that NLL (default "token_mean", TRL's;
        "seq_mean_token_mean" is OpenRLHF's and ORPO's paper; not "seq_mean_token_sum_norm",
        whose constant length the preference losses have no field for).
      desirable_weight, undesirable_weight: kto: λ_D, λ_U (default 1.0).
      epochs: passes over each batch.
      minibatches: optimizer updates per epoch.
      shuffle: reshuffle the rows every epoch.
      chunk_size: positions per vocabulary chunk of the forward.
      shared_prompt: paired losses: the policy's and the reference's forwards run each pair's
        prompt once per layer for both completions (`Decoder.shared_prompt_hidden_states`
        with `G = 2`; the same log-probs and gradients up to float rounding, `P + T_c + T_r`
        token rows per pair instead of `2·(P + T)`). The chosen and rejected rows of a batch
        must then share their prompt tokens and padding, as `make_preference_batch` builds
        them (not compared at run time). Only where the model builds its plain program (no
        mesh or a mesh of one device); elsewhere it changes nothing. The runner turns it on
        with `train.shared_prompt_forward`.
      precompute_reference: dpo/rpo (with a reference) and bco: score every example with the
        reference once, before the first step (`precompute_reference_logprobs`; TRL's
        `precompute_ref_log_probs`), and read its log-probs from that table at each step: no
        reference forward per step, and no copy of the reference's parameters kept while
        training. The same values up to float rounding (other batches pad differently). Not
        for KTO (its reference point scores each batch's mismatched pairs) nor with a moving
        reference (`train.reference_sync`).
      packing: paired losses: several pairs per row with no padding, each pair's prompt once
        (`jaxrl_llm.train.pair_packing`: `[prompt | chosen | rejected]` runs, the rejected
        tokens reading the prompt but not the chosen ones), for the policy's and the
        reference's forwards; the same log-probs and gradients up to float rounding, with
        only the pairs' real tokens computed. The batch is packed on the host for the
        update's micro-batches (`pack_preference_batch`), so the rows must not be reshuffled
        between minibatches (`minibatches > 1` needs `shuffle: false`). Only where the model
        builds its plain program (no mesh or a mesh of one device). Takes precedence over
        `shared_prompt`.
      packing_length: slots per packed row (None: the padded pair's `P + 2T` of each
        batch's buckets, which always fits); set it to fix the row length across buckets.

    Examples:
      >>> PreferenceConfig(loss="dpo", beta=0.1, loss_type=("sigmoid", "bco_pair"),
      ...                  loss_weights=(0.8, 0.2)).uses_reference
      True
      >>> PreferenceConfig(loss="simpo", nll_coef=1.0)
      Traceback (most recent call last):
      ...
      ValueError: PreferenceConfig: `nll_coef` is not used by loss 'simpo'; remove it (got 1.0).
    """

    loss: PreferenceLoss = "dpo"
    beta: float | None = None
    loss_type: str | tuple[str, ...] | None = None
    loss_weights: tuple[float, ...] | None = None
    label_smoothing: float | None = None
    reference_free: bool | None = None
    f_divergence: FDivergence | None = None
    f_alpha: float | None = None
    discopop_tau: float | None = None
    normalize_by_length: bool | None = None
    ld_alpha: float | None = None
    gamma: float | None = None
    alpha: float | None = None
    average_logprobs: bool | None = None
    nll_coef: float | None = None
    nll_agg: AggMode | None = None
    desirable_weight: float | None = None
    undesirable_weight: float | None = None
    epochs: int = 1
    minibatches: int = 1
    shuffle: bool = True
    chunk_size: int | None = None
    shared_prompt: bool = False
    precompute_reference: bool = False
    packing: bool = False
    packing_length: int | None = None

    def __post_init__(self) -> None:
        where = "PreferenceConfig"
        if self.loss not in _LOSS_FIELDS:
            raise ValueError(
                f"{where}: `loss` must be one of {', '.join(_LOSS_FIELDS)}, got {self.loss!r}."
            )
        used = _LOSS_FIELDS[self.loss]
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name not in (*used, *_STEP_FIELDS) and value is not None:
                raise ValueError(
                    f"{where}: `{field.name}` is not used by loss {self.loss!r}; remove it "
                    f"(got {value!r})."
                )
        for key in ("loss_type", "loss_weights"):  # built in Python with a list: freeze it
            if isinstance(getattr(self, key), list):
                object.__setattr__(self, key, tuple(getattr(self, key)))
        self._check_values(where)
        _dry_run(self)

    def _check_values(self, where: str) -> None:
        for key in ("epochs", "minibatches"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}: `{key}` must be an int >= 1, got {value!r}.")
        if self.chunk_size is not None and (
            isinstance(self.chunk_size, bool) or self.chunk_size < 1
        ):
            raise ValueError(
                f"{where}: `chunk_size` must be >= 1 or null, got {self.chunk_size!r}."
            )
        if not isinstance(self.shared_prompt, bool):
            raise ValueError(
                f"{where}: `shared_prompt` must be a bool, got {self.shared_prompt!r}."
            )
        if not isinstance(self.precompute_reference, bool):
            raise ValueError(
                f"{where}: `precompute_reference` must be a bool, got "
                f"{self.precompute_reference!r}."
            )
        if self.precompute_reference and (not self.uses_reference or self.loss == "kto"):
            raise ValueError(
                f"{where}: `precompute_reference` needs a loss that reads the reference's "
                "log-probs of its own examples (dpo or rpo with a reference, bco); loss "
                f"{self.loss!r}"
                + (
                    " scores mismatched pairs of each batch with the reference."
                    if self.loss == "kto"
                    else (" with reference_free" if self.reference_free else "")
                    + " reads no reference."
                )
            )
        if not isinstance(self.packing, bool):
            raise ValueError(f"{where}: `packing` must be a bool, got {self.packing!r}.")
        if self.packing and not self.paired:
            raise ValueError(
                f"{where}: `packing` lays out preference pairs; loss 'kto' takes unpaired examples."
            )
        _check_packing(self, where)
        if self.shared_prompt and not self.paired:
            raise ValueError(
                f"{where}: `shared_prompt` needs pairs that share a prompt; loss 'kto' takes "
                "unpaired examples."
            )
        if self.beta is not None and not self.beta > 0:
            raise ValueError(f"{where}: `beta` must be > 0, got {self.beta!r}.")
        if self.loss in ("dpo", "rpo"):
            allowed, several = losses.DPO_LOSS_TYPES, True
        elif self.loss == "cpo":
            allowed, several = losses.CPO_LOSS_TYPES, False
        else:
            allowed, several = losses.KTO_LOSS_TYPES, False
        types = self.loss_types
        if self.loss_type is not None:
            if isinstance(self.loss_type, tuple) and not several:
                raise ValueError(
                    f"{where}: loss {self.loss!r} takes one `loss_type`, got {self.loss_type!r}."
                )
            bad = [t for t in types if t not in allowed]
            if bad or not types:
                raise ValueError(
                    f"{where}: `loss_type` must be one of {', '.join(allowed)}"
                    + (" (or a list of them)" if several else "")
                    + f", got {self.loss_type!r}."
                )
        if self.loss_weights is not None and (
            not isinstance(self.loss_type, tuple) or len(self.loss_weights) != len(types)
        ):
            raise ValueError(
                f"{where}: `loss_weights` needs a list `loss_type` of the same length, got "
                f"loss_weights={self.loss_weights!r} with loss_type={self.loss_type!r}."
            )
        if self.normalize_by_length and not set(types) & set(_LENGTH_TYPES):
            raise ValueError(
                f"{where}: `normalize_by_length` is read only by loss types "
                f"{', '.join(_LENGTH_TYPES)}, got loss_type={self.loss_type!r}."
            )
        if self.ld_alpha is not None and not 0.0 <= self.ld_alpha <= 1.0:
            raise ValueError(f"{where}: `ld_alpha` must lie in [0, 1], got {self.ld_alpha!r}.")
        if self.nll_agg is not None and self.nll_agg not in losses.AGG_MODES:
            raise ValueError(
                f"{where}: `nll_agg` must be one of {', '.join(losses.AGG_MODES)}, got "
                f"{self.nll_agg!r}."
            )
        if self.nll_agg == "seq_mean_token_sum_norm":  # its constant would be the padded width
            raise ValueError(
                f"{where}: `nll_agg` 'seq_mean_token_sum_norm' divides by a fixed length that the "
                "preference losses do not set (it would fall back to the batch's padded width, "
                "which changes from batch to batch); use 'token_mean', 'seq_mean_token_mean', "
                "'seq_mean_token_sum' or 'token_sum'."
            )
        for key in ("nll_coef", "desirable_weight", "undesirable_weight"):
            value = getattr(self, key)
            if value is not None and value < 0:
                raise ValueError(f"{where}: `{key}` must be >= 0, got {value!r}.")

    @property
    def loss_types(self) -> tuple[str, ...]:
        """The DPO/CPO/KTO loss type(s) as a tuple (the loss's default when unset)."""
        if self.loss_type is None:
            return {"dpo": ("sigmoid",), "rpo": ("sigmoid",), "cpo": ("sigmoid",)}.get(
                self.loss, ("kto",) if self.loss == "kto" else ()
            )
        return self.loss_type if isinstance(self.loss_type, tuple) else (self.loss_type,)

    @property
    def prompt_group_size(self) -> int:
        """Rows per shared prompt of the log-prob forwards: 2 with `shared_prompt`, else 1."""
        return 2 if self.shared_prompt else 1

    @property
    def paired(self) -> bool:
        """True for losses on (chosen, rejected) pairs; False for KTO's labelled examples."""
        return self.loss != "kto"

    @property
    def uses_reference(self) -> bool:
        """Whether the batch needs reference log-probs."""
        if self.loss in ("dpo", "rpo"):
            return not self.reference_free
        return self.loss in ("kto", "bco")

    @property
    def needs_reference_point(self) -> bool:
        """KTO with loss_type "kto" reads the batch reference point `z`."""
        return self.loss == "kto" and self.loss_types == ("kto",)

    @property
    def sequence_reduce(self) -> Literal["sum", "mean"]:
        """How token log-probs become sequence log-probs for this loss."""
        average = self.average_logprobs
        if average is None:
            average = _AVERAGED_BY_DEFAULT.get(self.loss, False)
        return "mean" if average else "sum"

    @property
    def effective_nll_coef(self) -> float:
        """The NLL weight (0 for losses without an NLL term)."""
        if self.loss not in _NLL_LOSSES:
            return 0.0
        return _DEFAULT_NLL_COEF if self.nll_coef is None else self.nll_coef


def _check_packing(config: Any, where: str) -> None:
    """The `packing` / `packing_length` checks shared by `PreferenceConfig` and
    `RewardModelConfig` (`jaxrl_llm.train.pair_packing`).

    Raises:
      ValueError: a `packing_length` without packing or below 2, or packing with shuffled
        minibatches (their reshuffle would break the per-micro-batch rows).

    Examples:
      >>> _check_packing(PreferenceConfig(), "demo")  # packing off: nothing to check
    """
    length = config.packing_length
    if length is not None and (
        not config.packing or isinstance(length, bool) or not isinstance(length, int) or length < 2
    ):
        raise ValueError(
            f"{where}: `packing_length` must be an int >= 2 with `packing: true`, got "
            f"{length!r} (packing={config.packing!r})."
        )
    if config.packing and config.minibatches > 1 and config.shuffle:
        raise ValueError(
            f"{where}: `packing` packs each micro-batch's pairs into its own rows, which a "
            f"reshuffle between minibatches would break; with minibatches = "
            f"{config.minibatches} set `shuffle: false` (or turn packing off)."
        )


def _set(config: PreferenceConfig, *names: str, rename: dict[str, str] | None = None) -> dict:
    """The options among `names` that are set, as keywords of the loss function."""
    rename = rename or {}
    return {rename.get(n, n): getattr(config, n) for n in names if getattr(config, n) is not None}


def _dpo_keywords(config: PreferenceConfig) -> dict[str, Any]:
    kw = _set(
        config,
        "beta",
        "loss_type",
        "loss_weights",
        "label_smoothing",
        "f_divergence",
        "f_alpha",
        "discopop_tau",
    )
    kw["reference_free"] = bool(config.reference_free)
    return kw


def _dry_run(config: PreferenceConfig) -> None:
    """Trace the loss once on two dummy pairs so its own static checks run at load time."""
    z = jnp.zeros(2, jnp.float32)

    def trace() -> Any:
        loss = config.loss
        if loss in ("dpo", "rpo"):
            ref = z if config.uses_reference else None
            lengths = {}
            if config.normalize_by_length:
                lengths = {"chosen_length": jnp.ones(2), "rejected_length": jnp.ones(2)}
            return losses.dpo_loss(z, z, ref, ref, **_dpo_keywords(config), **lengths)
        if loss == "simpo":
            return losses.simpo_loss(
                z, z, **_set(config, "beta", "gamma", "label_smoothing", "alpha")
            )
        if loss == "cpo":
            return losses.cpo_loss(z, z, **_set(config, "beta", "loss_type", "label_smoothing"))
        if loss == "orpo":
            return losses.orpo_loss(z, z, **_set(config, "beta"))
        if loss == "kto":
            kw = _set(config, "beta", "loss_type", "desirable_weight", "undesirable_weight")
            return losses.kto_loss(z, z, z, z, kl=jnp.zeros(()), **kw)
        return losses.bco_loss(z, z, z, z, **_set(config, "beta"))

    try:
        jax.eval_shape(trace)
    except ValueError as err:
        raise ValueError(f"PreferenceConfig (loss={config.loss!r}): {err}") from None
