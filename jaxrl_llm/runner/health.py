"""Run health: skipped non-finite steps, the stop-with-diagnosis, degenerate-batch warnings.

A step whose loss or gradient is non-finite is skipped inside the compiled update step
(`update_step(skip_nonfinite=True)`: parameters and optimizer state unchanged) and reported as
`optim/skipped`. `SkipTracker` counts consecutive skips; after `train.max_consecutive_skips` the
run stops with `TrainingDivergedError`, whose message names what went non-finite, first the host
side then each loss term:

    the rewards        reward/nonfinite > 0 (non-finite total rewards reached the estimator)
    the advantages     adv/mean non-finite (from the rewards, the KL in the reward, the critic)
    policy loss        nonfinite/policy        KL        nonfinite/kl
    value loss         nonfinite/value         entropy   nonfinite/entropy
    other loss terms   nonfinite/<term>        (SFT, preference losses)
    the gradient       only the gradient norm was non-finite

Degenerate batches never produce NaN (every normaliser is clamped at 1), but they teach
nothing; `degenerate_batch_warnings` names them for a log warning: no group with a reward
spread and advantages all zero (a group-relative estimator; a critic's GAE or a KL in the reward
still gives a signal), every completion truncated, every completion empty, every row dropped by
a reward failure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

_TERM_NAMES = {"policy": "policy loss", "kl": "KL", "value": "value loss", "entropy": "entropy"}


class TrainingDivergedError(RuntimeError):
    """Too many consecutive steps were skipped for non-finite values; the message diagnoses it.

    Examples:
      >>> issubclass(TrainingDivergedError, RuntimeError)
      True
    """


class SkipTracker(NamedTuple):
    """Consecutive and total skipped steps (a value: `update` returns a new tracker).

    Examples:
      >>> t = SkipTracker().update(True).update(True)
      >>> t.consecutive, t.total, t.update(False).consecutive
      (2, 2, 0)
    """

    consecutive: int = 0
    total: int = 0

    def update(self, skipped: bool) -> SkipTracker:
        """The tracker after one more step."""
        if skipped:
            return SkipTracker(self.consecutive + 1, self.total + 1)
        return SkipTracker(0, self.total)


def nonfinite_terms(metrics: Mapping[str, float]) -> list[str]:
    """What went non-finite in a skipped step, most upstream first (module docstring).

    Examples:
      >>> nonfinite_terms({"nonfinite/policy": 0.0, "nonfinite/kl": 1.0, "adv/mean": 0.1})
      ['KL (loss/kl)']
      >>> nonfinite_terms({"reward/nonfinite": 2.0, "adv/mean": float("nan"), "nonfinite/policy": 1.0})
      ['the rewards (2 non-finite)', 'the advantages (adv/mean)', 'policy loss (loss/policy)']
      >>> nonfinite_terms({"nonfinite/grad_norm": 1.0})
      ['the gradient (every loss term was finite)']
      >>> nonfinite_terms({"nonfinite/preference": 1.0, "nonfinite/total": 1.0})
      ['preference (loss/preference)']
    """
    found = []
    if metrics.get("reward/nonfinite", 0.0) > 0:
        found.append(f"the rewards ({int(metrics['reward/nonfinite'])} non-finite)")
    if "adv/mean" in metrics and not math.isfinite(metrics["adv/mean"]):
        found.append("the advantages (adv/mean)")
    flagged = [
        key.split("/", 1)[1]
        for key, value in metrics.items()
        if key.startswith("nonfinite/") and value > 0
    ]
    terms = [t for t in flagged if t not in ("total", "grad_norm")]
    known = [t for t in _TERM_NAMES if t in terms]  # the RL terms in a fixed order
    others = sorted(t for t in terms if t not in _TERM_NAMES)  # sft / preference terms
    found += [f"{_TERM_NAMES.get(t, t)} (loss/{t})" for t in known + others]
    if not found and metrics.get("nonfinite/total", 0.0) > 0:
        found.append("the total loss (loss/total)")
    if not found:
        found.append("the gradient (every loss term was finite)")
    return found


def divergence_message(step: int, skips: int, metrics: Mapping[str, float], checkpoint: str) -> str:
    """The stop message after `skips` consecutive skipped steps.

    Examples:
      >>> print(divergence_message(7, 3, {"nonfinite/kl": 1.0}, "step 4 in runs/x/checkpoints"))
      training stopped at step 7: 3 consecutive steps were skipped because the loss or its gradient was non-finite; non-finite: KL (loss/kl). The parameters are those of the last finite step; latest checkpoint: step 4 in runs/x/checkpoints. Lower optim.learning_rate, set optim.max_grad_norm, or check the reward functions, then continue with --resume.
    """
    terms = ", ".join(nonfinite_terms(metrics))
    return (
        f"training stopped at step {step}: {skips} consecutive steps were skipped because the "
        f"loss or its gradient was non-finite; non-finite: {terms}. The parameters are those of "
        f"the last finite step; latest checkpoint: {checkpoint}. Lower optim.learning_rate, set "
        "optim.max_grad_norm, or check the reward functions, then continue with --resume."
    )


def degenerate_batch_warnings(metrics: Mapping[str, float]) -> list[str]:
    """Warnings for a batch without a learning signal (module docstring).

    Examples:
      >>> degenerate_batch_warnings({"adv/frac_zero_std": 1.0, "adv/std": 0.0,
      ...                            "response/truncated_frac": 0.5})
      ['every group has equal rewards: the advantages are 0 and this step changes nothing but the KL and entropy terms']
      >>> degenerate_batch_warnings({"adv/frac_zero_std": 1.0, "adv/std": 1.0})  # PPO's GAE
      []
      >>> degenerate_batch_warnings({"response/truncated_frac": 1.0, "response/empty_frac": 0.0})
      ['every completion hit sampling.max_new_tokens without a stop token or stop string']
    """
    out = []
    if metrics.get("reward/valid_frac", 1.0) == 0.0:
        out.append("every group was dropped by reward-function failures (rewards.on_failure)")
    elif metrics.get("adv/frac_zero_std", 0.0) == 1.0 and metrics.get("adv/std", 0.0) == 0.0:
        out.append(
            "every group has equal rewards: the advantages are 0 and this step changes nothing "
            "but the KL and entropy terms"
        )
    if metrics.get("response/truncated_frac", 0.0) == 1.0:
        out.append(
            "every completion hit sampling.max_new_tokens without a stop token or stop string"
        )
    if metrics.get("response/empty_frac", 0.0) == 1.0:
        out.append("every completion is empty (the stop token came first)")
    return out
