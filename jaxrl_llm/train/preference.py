"""Offline preference training: DPO (every loss type), RPO, SimPO, CPO, ORPO, KTO and BCO.

The compiled update step is generic over an `Objective`; this module supplies the one for
preference data. A `PreferenceBatch` holds, per row, a chosen and a rejected sequence (each a
`SequenceBatch`: prompt left-padded to `P`, completion right-padded to `T`) and the frozen
reference's sequence log-probs, computed once per batch before the step. KTO's rows are single
labelled examples (`chosen` holds them, `labels` says which are desirable) plus the batch's
reference point `z`; BCO's rows carry the running reward shift `δ`.

One micro-batch of the objective (`preference_objective`):

    lp        = completion_logprobs(policy, concat(chosen, rejected))      one forward, [2N,T]
                (`shared_prompt`: the rows of a pair side by side, its prompt run once)
    π_c, π_r  = losses.sequence_logprob(lp, m; sum | mean)                  (or LD-DPO's sums)
    L         = losses.<loss>(π_c, π_r, ref_c, ref_r; …, num_pairs = D)    mean over the D pairs
                + c·losses.nll_loss(lp_c, m_c; agg, global counts)         RPO, CPO, ORPO

`D` is the number of valid pairs of the whole optimizer update (`Normalizers.num_seqs`), so the
`k` micro-batches of an update add up to the loss of the whole minibatch, exactly as
`sft_objective` does with tokens. The NLL term uses the update's chosen-token count
(`Normalizers.num_tokens`).

Host-side preparation of a batch (`prepare_preference_batch`) runs jitted forwards of the
reference (`reference_logprobs`), of KTO's mismatched pairs (`kto_kl_sequences`, the reference
point `z = max(mean(π − ref), 0)` over them, as TRL's `KTOTrainer`) and, for BCO, of the policy
(the running mean of the implicit rewards). `train_preference` is a complete small offline run
over JSONL or in-memory records.

Sources: DPO "Direct Preference Optimization: Your Language Model is Secretly a Reward Model"
(arXiv 2305.18290); RPO "Provably Mitigating Overoptimization in RLHF" (arXiv 2405.16436);
SimPO (arXiv 2405.14734); CPO (arXiv 2401.08417); ORPO (arXiv 2403.07691); KTO
(arXiv 2402.01306); BCO (arXiv 2404.04656); LD-DPO (arXiv 2409.06411). Formulas: ALGORITHMS.md §8.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

import losses
from jaxrl_llm.models._sharded_ops import plain_layout, unsharded
from jaxrl_llm.train.batch import (
    Normalizers,
    SequenceBatch,
    check_sequence_batch,
    prompt_length,
)
from jaxrl_llm.train.logprobs import completion_logprobs
from jaxrl_llm.train.objectives import Objective
from jaxrl_llm.train.pair_packing import PackedPairs, pack_pairs, packed_pair_logprobs
from jaxrl_llm.train.params import ModelGraphs
from jaxrl_llm.train.preference_config import (
    _NLL_LOSSES,
    PreferenceConfig,
    _dpo_keywords,
    _set,
)
from sharding import fetch_global


class PreferenceBatch(NamedTuple):
    """One batch of preference data (a pytree; every leaf has the leading axis `N`).

    Attributes:
      chosen: `SequenceBatch` of the chosen responses (KTO: of the labelled examples).
      rejected: `SequenceBatch` of the rejected responses, with the same prompts; None for KTO.
      ref_chosen_logp: `[N]` reference sequence log-probs (sums) of `chosen`, or None
        (reference-free losses).
      ref_rejected_logp: `[N]` reference sequence log-probs of `rejected`, or None.
      labels: `[N]` {0,1} KTO labels, 1 = desirable; None for paired losses.
      kl_reference_point: `[N]` KTO's reference point `z` of the whole batch (the same value in
        every row, so micro-batches keep it); None otherwise.
      reward_shift: `[N]` BCO's running reward mean `δ` (the same value in every row), or None.
      packed: the pairs packed several to a row (`PreferenceConfig.packing`,
        `pack_preference_batch`), or None; its row leaves have a leading axis of packed rows,
        its pair leaves `N`. The forwards then run the packed rows (where the model builds
        its plain program) and read the padded `chosen` / `rejected` for the targets' masks.

    A row whose chosen (or rejected) completion has no valid token is padding: it leaves the
    loss and its normalisers.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = SequenceBatch(jnp.ones((2, 5), jnp.int32), jnp.ones((2, 5)), jnp.ones((2, 2)))
      >>> b = PreferenceBatch(chosen=s, rejected=s, ref_chosen_logp=jnp.zeros(2),
      ...                     ref_rejected_logp=jnp.zeros(2))
      >>> len(jax.tree.leaves(b)), b.labels is None
      (8, True)
    """

    chosen: SequenceBatch
    rejected: SequenceBatch | None = None
    ref_chosen_logp: jax.Array | None = None
    ref_rejected_logp: jax.Array | None = None
    labels: jax.Array | None = None
    kl_reference_point: jax.Array | None = None
    reward_shift: jax.Array | None = None
    packed: PackedPairs | None = None


def check_preference_batch(config: PreferenceConfig, batch: Any, *, where: str) -> None:
    """Validate a `PreferenceBatch` against the loss of `config` (static shapes and fields).

    Raises:
      ValueError: naming the field, what the loss needs and what was received.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = SequenceBatch(jnp.ones((2, 5), jnp.int32), jnp.ones((2, 5)), jnp.ones((2, 2)))
      >>> check_preference_batch(PreferenceConfig(), PreferenceBatch(s, s), where="demo")
      Traceback (most recent call last):
      ...
      ValueError: demo: loss 'dpo' needs `ref_chosen_logp` (reference sequence log-probs from reference_logprobs / prepare_preference_batch), got None.
    """
    if not isinstance(batch, PreferenceBatch):
        raise ValueError(f"{where}: expected a PreferenceBatch, got {type(batch).__name__}.")
    check_sequence_batch(batch.chosen, where=f"{where} (chosen)")
    N = batch.chosen.tokens.shape[0]
    if config.paired:
        if batch.rejected is None:
            raise ValueError(f"{where}: loss {config.loss!r} needs `rejected` sequences, got None.")
        check_sequence_batch(batch.rejected, where=f"{where} (rejected)")
        if batch.rejected.tokens.shape[0] != N:
            raise ValueError(
                f"{where}: `rejected` must have N = {N} rows like `chosen`, got "
                f"{batch.rejected.tokens.shape[0]}."
            )
    elif batch.rejected is not None:
        raise ValueError(
            f"{where}: loss 'kto' takes unpaired labelled examples in `chosen`; `rejected` must "
            "be None."
        )
    if batch.packed is not None:
        T = max(batch.chosen.completion_mask.shape[1], batch.rejected.completion_mask.shape[1])
        if batch.packed.row.shape != (N,) or batch.packed.slots.shape != (N, 2, T):
            raise ValueError(
                f"{where}: `packed` must hold the N = {N} pairs' rows [N] and slots [N, 2, {T}] "
                f"(pack_preference_batch of this batch), got {batch.packed.row.shape} and "
                f"{batch.packed.slots.shape}."
            )
    needed = {
        "ref_chosen_logp": config.uses_reference,
        "ref_rejected_logp": config.uses_reference and config.paired,
        "labels": config.loss == "kto",
        "kl_reference_point": config.needs_reference_point,
        "reward_shift": config.loss == "bco",
    }
    for name, need in needed.items():
        value = getattr(batch, name)
        if value is None:
            if need:
                raise ValueError(
                    f"{where}: loss {config.loss!r} needs `{name}` ("
                    + _FIELD_SOURCES[name]
                    + "), got None."
                )
            continue
        if value.shape != (N,) or not jnp.issubdtype(value.dtype, jnp.floating):
            raise ValueError(
                f"{where}: `{name}` must be a floating array of shape ({N},) ([N]), got "
                f"{value.dtype}{value.shape}."
            )


_FIELD_SOURCES = {
    "ref_chosen_logp": "reference sequence log-probs from reference_logprobs / "
    "prepare_preference_batch",
    "ref_rejected_logp": "reference sequence log-probs from reference_logprobs / "
    "prepare_preference_batch",
    "labels": "1 = desirable, 0 = undesirable",
    "kl_reference_point": "KTO's batch reference point from prepare_preference_batch",
    "reward_shift": "BCO's running reward mean from prepare_preference_batch",
}


def concat_sequences(a: SequenceBatch, b: SequenceBatch) -> SequenceBatch:
    """Stack two `SequenceBatch`es along `N`, padding to a common prompt and completion length.

    Prompts are padded on the left and completions on the right (token 0, mask 0), so the
    layout of `jaxrl_llm.train.batch` holds for the result: one forward scores both.

    Examples:
      >>> import jax.numpy as jnp
      >>> a = SequenceBatch(jnp.array([[1, 2, 3]]), jnp.ones((1, 3)), jnp.ones((1, 1)))
      >>> b = SequenceBatch(jnp.array([[4, 5, 6]]), jnp.ones((1, 3)), jnp.ones((1, 2)))
      >>> c = concat_sequences(a, b)
      >>> c.tokens.tolist(), c.completion_mask.tolist()
      ([[1, 2, 3, 0], [0, 4, 5, 6]], [[1.0, 0.0], [1.0, 1.0]])
    """
    P = max(prompt_length(a), prompt_length(b))
    T = max(a.completion_mask.shape[1], b.completion_mask.shape[1])

    def pad(s: SequenceBatch) -> SequenceBatch:
        p, t = prompt_length(s), s.completion_mask.shape[1]
        if (p, t) == (P, T):
            return s
        widths = ((0, 0), (P - p, T - t))
        return SequenceBatch(
            jnp.pad(s.tokens, widths),
            jnp.pad(s.attention_mask, widths),
            jnp.pad(s.completion_mask, ((0, 0), (0, T - t))),
        )

    if a.segment_ids is not None or b.segment_ids is not None:
        raise ValueError("concat_sequences: packed rows (`segment_ids`) have no common prompt.")
    a, b = pad(a), pad(b)
    return SequenceBatch(
        *(jnp.concatenate([x, y], axis=0) for x, y in zip(a[:3], b[:3], strict=True))
    )


def kto_kl_sequences(seqs: SequenceBatch) -> SequenceBatch:
    """KTO's mismatched pairs: row `i`'s prompt with row `i − 1`'s completion (row 0: the last).

    TRL's `KTOTrainer` pairs each prompt with the previous example's completion to estimate
    `KL(π ‖ π_ref)`; in the left-/right-padded layout that is a roll of the completion columns
    by one row.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = SequenceBatch(jnp.array([[1, 7], [2, 8], [3, 9]]), jnp.ones((3, 2)), jnp.ones((3, 1)))
      >>> kto_kl_sequences(s).tokens.tolist()
      [[1, 9], [2, 7], [3, 8]]
    """
    P = prompt_length(seqs)

    def mismatch(x: jax.Array) -> jax.Array:
        return jnp.concatenate([x[:, :P], jnp.roll(x[:, P:], 1, axis=0)], axis=1)

    return SequenceBatch(
        mismatch(jnp.asarray(seqs.tokens)),
        mismatch(jnp.asarray(seqs.attention_mask)),
        jnp.roll(jnp.asarray(seqs.completion_mask), 1, axis=0),
    )


def _has_tokens(mask: jax.Array) -> jax.Array:
    return (jnp.sum(jnp.asarray(mask) > 0, axis=1) > 0).astype(jnp.float32)


def pair_valid(batch: PreferenceBatch) -> jax.Array:
    """`[N]` float32 {0,1}: rows whose chosen (and rejected) completion has a valid token.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = SequenceBatch(jnp.ones((2, 4), jnp.int32), jnp.ones((2, 4)), jnp.array([[1, 0], [0, 0]]))
      >>> pair_valid(PreferenceBatch(chosen=s)).tolist()
      [1.0, 0.0]
    """
    valid = _has_tokens(batch.chosen.completion_mask)
    if batch.rejected is not None:
        valid = valid * _has_tokens(batch.rejected.completion_mask)
    return valid


def preference_normalizers(batch: PreferenceBatch) -> Normalizers:
    """Additive counts of a (micro-)batch: valid pairs (`num_seqs`) and their chosen tokens.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = SequenceBatch(jnp.ones((2, 5), jnp.int32), jnp.ones((2, 5)), jnp.array([[1, 1], [1, 0]]))
      >>> n = preference_normalizers(PreferenceBatch(chosen=s, rejected=s))
      >>> float(n.num_seqs), float(n.num_tokens)
      (2.0, 3.0)
    """
    valid = pair_valid(batch)
    chosen = (jnp.asarray(batch.chosen.completion_mask) > 0).astype(jnp.float32)
    return Normalizers(
        num_tokens=jnp.sum(chosen * valid[:, None]),
        num_seqs=jnp.sum(valid),
        grad_scale=jnp.ones((), jnp.float32),
    )


def sequence_logprobs(
    config: PreferenceConfig,
    chosen_logp: jax.Array,
    chosen_mask: jax.Array,
    rejected_logp: jax.Array | None,
    rejected_mask: jax.Array | None,
) -> tuple[jax.Array, jax.Array | None]:
    """Sequence log-probs `[N]` of the chosen and rejected completions, as the loss reads them.

    `losses.sequence_logprob` with `config.sequence_reduce` ("sum", or "mean" for the
    length-averaged losses), or LD-DPO's `losses.ld_sequence_logprob` with `config.ld_alpha`.
    Used for the policy and the reference alike.

    Examples:
      >>> import jax.numpy as jnp
      >>> lp, m = jnp.array([[-1.0, -3.0]]), jnp.ones((1, 2))
      >>> c, r = sequence_logprobs(PreferenceConfig(loss="orpo"), lp, m, lp, m)
      >>> float(c[0]), float(r[0])
      (-2.0, -2.0)
    """
    if rejected_logp is None:
        return losses.sequence_logprob(
            chosen_logp, chosen_mask, reduce=config.sequence_reduce
        ), None
    if config.ld_alpha is not None:
        return losses.ld_sequence_logprob(
            chosen_logp, chosen_mask, rejected_logp, rejected_mask, alpha=config.ld_alpha
        )
    reduce = config.sequence_reduce
    return (
        losses.sequence_logprob(chosen_logp, chosen_mask, reduce=reduce),
        losses.sequence_logprob(rejected_logp, rejected_mask, reduce=reduce),
    )


def _nll(
    config: PreferenceConfig, chosen_logp: jax.Array, chosen_mask: jax.Array, norms: Normalizers
) -> tuple[jax.Array, dict[str, jax.Array]]:
    return losses.nll_loss(
        chosen_logp,
        chosen_mask,
        agg=config.nll_agg or "token_mean",
        num_tokens=jnp.maximum(norms.num_tokens, 1.0),
        num_seqs=jnp.maximum(norms.num_seqs, 1.0),
    )


def _share_metrics(metrics: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Loss parts normalised by the update's global counts are `loss/…` keys (summed per update)."""
    out = {}
    for key, value in metrics.items():
        if key.startswith("pref/loss_"):
            out["loss/" + key.removeprefix("pref/loss_")] = value
        elif key not in ("pref/nll", "pref/dpo_loss"):  # rpo_loss's parts: reported as loss/…
            out[key] = value
    return out


def preference_loss(
    config: PreferenceConfig,
    batch: PreferenceBatch,
    chosen_logp: jax.Array,
    rejected_logp: jax.Array | None,
    norms: Normalizers,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The loss of one micro-batch from the policy's token log-probs (no model call).

    With the sequence log-probs of `sequence_logprobs`, the valid pairs `v` (`pair_valid`) and
    `D = max(norms.num_seqs, 1)` valid pairs in the whole optimizer update:

        dpo    losses.dpo_loss(π_c, π_r, ref_c, ref_r; …, valid=v, num_pairs=D)
        rpo    losses.rpo_loss(…, NLL)                     NLL = nll_loss(lp_c, m_c·v; nll_agg)
        simpo  losses.simpo_loss(π̄_c, π̄_r; …)             cpo / orpo: + nll_coef·NLL
        kto    losses.kto_loss(π, π, ref, ref; kl=z, chosen_valid=v·y, rejected_valid=v·(1−y),
                               num_examples=D)
        bco    losses.bco_loss(π_c, π_r, ref_c, ref_r; δ) · Σv / D

    so the losses of an update's micro-batches add up to the loss of the update (the NLL uses
    the update's chosen-token count). The `aot` DPO types sort within the micro-batch, so for
    them accumulation is not exactly the full batch (as in TRL, which sorts per device).

    Args:
      config: the preference config.
      batch: the micro-batch (for the masks, reference log-probs, labels, `z`, `δ`).
      chosen_logp: `[N,T_c]` policy token log-probs of `batch.chosen` (0 outside the mask).
      rejected_logp: `[N,T_r]` of `batch.rejected`, or None (KTO).
      norms: the global normalisers of the optimizer update (`preference_normalizers`, summed).

    Returns:
      `(loss, metrics)`: the loss's `pref/…` metrics, `loss/total`, `loss/preference`, and with
      an NLL term `loss/nll` and `policy/nll_token_mean`; a weighted DPO combination adds
      `loss/<type>` per type.

    Examples:
      >>> import jax.numpy as jnp
      >>> s = SequenceBatch(jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4)), jnp.ones((1, 2)))
      >>> b = PreferenceBatch(s, s, jnp.array([-2.0]), jnp.array([-2.0]))
      >>> norms = preference_normalizers(b)
      >>> loss, m = preference_loss(PreferenceConfig(), b, jnp.array([[-0.5, -0.5]]),
      ...                           jnp.array([[-1.5, -1.5]]), norms)
      >>> round(float(loss), 6), float(m["pref/accuracy"])  # −logσ(0.1·(1 − (−1)))
      (0.598139, 1.0)
    """
    valid = pair_valid(batch)
    m_c = (jnp.asarray(batch.chosen.completion_mask) > 0).astype(jnp.float32) * valid[:, None]
    m_r = None
    if rejected_logp is not None:
        m_r = (jnp.asarray(batch.rejected.completion_mask) > 0).astype(jnp.float32)
        m_r = m_r * valid[:, None]
    pi_c, pi_r = sequence_logprobs(config, chosen_logp, m_c, rejected_logp, m_r)
    D = jnp.maximum(norms.num_seqs, 1.0)
    loss_name = config.loss
    nll = None
    extra: dict[str, jax.Array] = {}
    if loss_name in _NLL_LOSSES:
        nll, nll_metrics = _nll(config, chosen_logp, m_c, norms)
        extra["policy/nll_token_mean"] = nll_metrics["policy/nll_token_mean"]
    if loss_name in ("dpo", "rpo"):
        kw = _dpo_keywords(config)
        if config.normalize_by_length:
            kw["chosen_length"] = jnp.sum(m_c, axis=1)
            kw["rejected_length"] = jnp.sum(m_r, axis=1)
        refs = (batch.ref_chosen_logp, batch.ref_rejected_logp)
        if config.reference_free:
            refs = (None, None)
        if loss_name == "dpo":
            pref, metrics = losses.dpo_loss(pi_c, pi_r, *refs, valid=valid, num_pairs=D, **kw)
            total = pref
        else:
            total, metrics = losses.rpo_loss(
                pi_c,
                pi_r,
                *refs,
                nll,
                nll_coef=config.effective_nll_coef,
                valid=valid,
                num_pairs=D,
                **kw,
            )
            pref = metrics["pref/dpo_loss"]
    elif loss_name == "simpo":
        kw = _set(config, "beta", "gamma", "label_smoothing", "alpha")
        pref, metrics = losses.simpo_loss(pi_c, pi_r, valid=valid, num_pairs=D, **kw)
        total = pref
    elif loss_name == "cpo":
        kw = _set(config, "beta", "loss_type", "label_smoothing")
        pref, metrics = losses.cpo_loss(pi_c, pi_r, valid=valid, num_pairs=D, **kw)
        total = pref + config.effective_nll_coef * nll
    elif loss_name == "orpo":
        pref, metrics = losses.orpo_loss(
            pi_c, pi_r, valid=valid, num_pairs=D, **_set(config, "beta")
        )
        total = pref + config.effective_nll_coef * nll
    elif loss_name == "kto":
        labels = jnp.asarray(batch.labels, jnp.float32)
        z = batch.kl_reference_point[0] if config.needs_reference_point else None
        kw = _set(config, "beta", "loss_type", "desirable_weight", "undesirable_weight")
        pref, metrics = losses.kto_loss(
            pi_c,
            pi_c,
            batch.ref_chosen_logp,
            batch.ref_chosen_logp,
            kl=z,
            chosen_valid=valid * (labels > 0),
            rejected_valid=valid * (labels <= 0),
            num_examples=D,
            **kw,
        )
        total = pref
    else:  # bco: a mean over this micro-batch's pairs, rescaled to the update's pairs
        local, metrics = losses.bco_loss(
            pi_c,
            pi_r,
            batch.ref_chosen_logp,
            batch.ref_rejected_logp,
            delta=batch.reward_shift[0],
            chosen_valid=valid,
            rejected_valid=valid,
            **_set(config, "beta"),
        )
        pref = local * jnp.sum(valid) / D
        total = pref
    metrics = _share_metrics(dict(metrics))
    metrics.update(extra)
    metrics["loss/preference"] = pref
    if nll is not None:
        metrics["loss/nll"] = config.effective_nll_coef * nll
    metrics["loss/total"] = total
    return total, jax.tree.map(jax.lax.stop_gradient, metrics)


def preference_objective(config: PreferenceConfig, graphs: ModelGraphs) -> Objective:
    """The objective of a preference loss over `PreferenceBatch`es (see `preference_loss`).

    One forward of the policy scores the chosen and rejected sequences together
    (`joint_token_logprobs`: `concat_sequences`, then `completion_logprobs`; with
    `config.shared_prompt` each pair's prompt runs once per layer); KTO scores its examples
    alone.

    Args:
      config: the preference config.
      graphs: model graphs from `split_models` (policy only).

    Returns:
      An `Objective` for `make_update_step` / `update_step`.

    Examples:
      >>> obj = preference_objective(PreferenceConfig(loss="simpo"), ModelGraphs(policy=None))
      >>> obj.normalizers is preference_normalizers
      True
    """
    if graphs.value is not None:
        raise ValueError(
            "preference_objective: preference losses train the policy only; split without a "
            "critic (graphs.value must be None)."
        )

    def forward(params: Any, frozen: Any, sequences: SequenceBatch) -> jax.Array:
        policy = nnx.merge(graphs.policy, params, frozen)
        if isinstance(sequences, PackedPairs):  # the update's micro-batch: rows `row`
            return packed_pair_logprobs(
                policy, sequences, in_micro_batch=True, chunk_size=config.chunk_size
            )
        logp, _, _ = completion_logprobs(
            policy, sequences, chunk_size=config.chunk_size, group_size=config.prompt_group_size
        )
        return logp

    def loss(
        params: dict, frozen: dict, batch: PreferenceBatch, norms: Normalizers, kl_coef: Any
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        del kl_coef
        chosen, rejected = joint_token_logprobs(
            forward, params["policy"], frozen["policy"], batch, shared_prompt=config.shared_prompt
        )
        return preference_loss(config, batch, chosen, rejected, norms)

    def check(batch: PreferenceBatch, updates_per_step: int) -> None:
        del updates_per_step  # the reference quantities are fixed for the whole step
        check_preference_batch(config, batch, where="preference_objective")

    return Objective(loss=loss, normalizers=preference_normalizers, check=check)


LogprobFn = Callable[[Any, Any, SequenceBatch], jax.Array]


def interleave_pairs(chosen: SequenceBatch, rejected: SequenceBatch) -> SequenceBatch:
    """`concat_sequences(chosen, rejected)` with the rows interleaved: pair `n` in rows `2n`
    (chosen) and `2n + 1` (rejected), the layout of groups of `G = 2` rows with one prompt
    (`completion_hidden(group_size=2)`, `Decoder.shared_prompt_hidden_states`).

    Examples:
      >>> import jax.numpy as jnp
      >>> c = SequenceBatch(jnp.array([[1, 2], [3, 4]]), jnp.ones((2, 2)), jnp.ones((2, 1)))
      >>> r = SequenceBatch(jnp.array([[1, 5], [3, 6]]), jnp.ones((2, 2)), jnp.ones((2, 1)))
      >>> interleave_pairs(c, r).tokens.tolist()
      [[1, 2], [1, 5], [3, 4], [3, 6]]
    """
    joint = concat_sequences(chosen, rejected)
    N = chosen.tokens.shape[0]

    def one(x: jax.Array) -> jax.Array:
        (x,) = unsharded(jnp.asarray(x))
        return jnp.stack([x[:N], x[N:]], axis=1).reshape(2 * N, *x.shape[1:])

    return SequenceBatch(*(one(x) for x in joint[:3]))


def check_shared_prompts(batch: PreferenceBatch, *, where: str = "check_shared_prompts") -> None:
    """Check on the host that each pair's chosen and rejected rows hold the same prompt tokens
    and padding once padded to a common shape (what `shared_prompt` assumes).

    Raises:
      ValueError: naming the first pair whose prompts differ, and the number of such pairs.

    Examples:
      >>> import jax.numpy as jnp
      >>> c = SequenceBatch(jnp.array([[1, 2, 3]]), jnp.ones((1, 3)), jnp.ones((1, 1)))
      >>> r = SequenceBatch(jnp.array([[1, 9, 4]]), jnp.ones((1, 3)), jnp.ones((1, 1)))
      >>> check_shared_prompts(PreferenceBatch(c, r))
      Traceback (most recent call last):
      ...
      ValueError: check_shared_prompts: pair 0's chosen and rejected rows have different prompts (1 of 1 pairs), which `shared_prompt` would run as one; build the pairs with make_preference_batch or turn shared_prompt off.
    """
    import numpy as np

    joint = concat_sequences(batch.chosen, batch.rejected)
    N, P = batch.chosen.tokens.shape[0], prompt_length(joint)
    tokens, mask = (np.asarray(x)[:, :P] for x in (joint.tokens, joint.attention_mask))
    differ = np.any((tokens[:N] != tokens[N:]) | (mask[:N] != mask[N:]), axis=1)
    if differ.any():
        raise ValueError(
            f"{where}: pair {int(np.argmax(differ))}'s chosen and rejected rows have different "
            f"prompts ({int(differ.sum())} of {N} pairs), which `shared_prompt` would run as "
            "one; build the pairs with make_preference_batch or turn shared_prompt off."
        )


def joint_token_logprobs(
    logprob_fn: LogprobFn,
    params: Any,
    frozen: Any,
    batch: PreferenceBatch,
    *,
    shared_prompt: bool = False,
) -> tuple[jax.Array, jax.Array | None]:
    """Token log-probs `[N,T_c]` of the chosen and `[N,T_r]` of the rejected completions from
    one call of `logprob_fn` on both (KTO: the chosen alone, and None).

    A batch with `packed` pairs (`PreferenceConfig.packing`), where the model builds its plain
    program (no mesh, or a mesh of one device), calls `logprob_fn` on the `PackedPairs`
    (`[N, 2, T]` log-probs: `packed_pair_logprobs`). Else, with `shared_prompt`
    (`PreferenceConfig.shared_prompt`) there, the rows are interleaved (`interleave_pairs`)
    so that a `logprob_fn` made with `group_size=2` runs each pair's prompt once per layer;
    elsewhere the chosen rows come first and then the rejected, as without it.

    Examples:
      >>> import jax.numpy as jnp
      >>> fn = lambda p, f, s: s.tokens[:, -2:].astype(jnp.float32)  # "log-probs" = tokens
      >>> c = SequenceBatch(jnp.array([[1, 2, 3]]), jnp.ones((1, 3)), jnp.ones((1, 2)))
      >>> r = SequenceBatch(jnp.array([[1, 5, 6]]), jnp.ones((1, 3)), jnp.ones((1, 2)))
      >>> lp_c, lp_r = joint_token_logprobs(fn, None, None, PreferenceBatch(c, r),
      ...                                   shared_prompt=True)
      >>> lp_c.tolist(), lp_r.tolist()
      ([[2.0, 3.0]], [[5.0, 6.0]])
    """
    if batch.rejected is None:
        return logprob_fn(params, frozen, batch.chosen), None
    T_c, T_r = batch.chosen.completion_mask.shape[1], batch.rejected.completion_mask.shape[1]
    if batch.packed is not None and plain_layout():
        logp = logprob_fn(params, frozen, batch.packed)  # [N, 2, T]
        return logp[:, 0, :T_c], logp[:, 1, :T_r]
    lp_c, lp_r = call_on_pairs(
        lambda seqs: logprob_fn(params, frozen, seqs),
        batch.chosen,
        batch.rejected,
        shared_prompt=shared_prompt,
    )
    return lp_c[:, :T_c], lp_r[:, :T_r]


def call_on_pairs(
    fn: Callable[[SequenceBatch], jax.Array],
    chosen: SequenceBatch,
    rejected: SequenceBatch,
    *,
    shared_prompt: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """`fn`'s per-row outputs for the chosen and the rejected rows, from one call on both:
    `concat_sequences` (chosen rows first), or with `shared_prompt`, where the model builds
    its plain program, `interleave_pairs` (pair `n` in rows `2n`, `2n + 1`: `fn` then runs
    groups of 2 rows with one prompt).

    Examples:
      >>> import jax.numpy as jnp
      >>> c = SequenceBatch(jnp.array([[1, 2]]), jnp.ones((1, 2)), jnp.ones((1, 1)))
      >>> r = SequenceBatch(jnp.array([[1, 5]]), jnp.ones((1, 2)), jnp.ones((1, 1)))
      >>> a, b = call_on_pairs(lambda s: s.tokens[:, -1], c, r, shared_prompt=True)
      >>> a.tolist(), b.tolist()
      ([2], [5])
    """
    if shared_prompt and plain_layout():
        out = fn(interleave_pairs(chosen, rejected))
        return out[0::2], out[1::2]
    out = fn(concat_sequences(chosen, rejected))
    N = chosen.tokens.shape[0]
    return out[:N], out[N:]


def reference_logprobs(
    logprob_fn: LogprobFn,
    ref_params: Any,
    frozen: Any,
    batch: PreferenceBatch,
    *,
    ld_alpha: float | None = None,
    shared_prompt: bool = False,
) -> tuple[jax.Array, jax.Array | None]:
    """Reference sequence log-prob sums `[N]` of the chosen (and rejected) completions.

    One call of the jitted forward `logprob_fn` (`make_logprob_fn(graphs.policy)`) on the
    chosen and rejected sequences together (`joint_token_logprobs`). `ld_alpha` gives LD-DPO's
    desensitised sums (use the config's `ld_alpha`). Rows without completion tokens get 0.

    Args:
      logprob_fn: `(params, frozen, SequenceBatch) -> logp[N,T]`.
      ref_params: the reference's trainable-subset parameters (`reference_params(...)`).
      frozen: the frozen policy parameters it shares (`state.frozen["policy"]`).
      batch: the `PreferenceBatch`.
      ld_alpha: LD-DPO's α, or None for plain sums.
      shared_prompt: each pair's prompt once per layer (`PreferenceConfig.shared_prompt`;
        `logprob_fn` made with `group_size=2`).

    Returns:
      `(ref_chosen_logp[N], ref_rejected_logp[N] or None)`, float32.

    Examples:
      >>> import jax.numpy as jnp
      >>> fn = lambda p, f, s: -jnp.ones(s.completion_mask.shape) * s.completion_mask
      >>> s = SequenceBatch(jnp.ones((1, 5), jnp.int32), jnp.ones((1, 5)), jnp.array([[1, 1, 0]]))
      >>> c, r = reference_logprobs(fn, None, None, PreferenceBatch(s, s))
      >>> c.tolist(), r.tolist()
      ([-2.0], [-2.0])
    """
    lp_c, lp_r = joint_token_logprobs(
        logprob_fn, ref_params, frozen, batch, shared_prompt=shared_prompt
    )
    m_c = jnp.asarray(batch.chosen.completion_mask)
    if lp_r is None:
        return losses.sequence_logprob(lp_c, m_c), None
    m_r = jnp.asarray(batch.rejected.completion_mask)
    if ld_alpha is not None:
        return losses.ld_sequence_logprob(lp_c, m_c, lp_r, m_r, alpha=ld_alpha)
    return losses.sequence_logprob(lp_c, m_c), losses.sequence_logprob(lp_r, m_r)


def precompute_reference_logprobs(
    config: PreferenceConfig,
    examples: Sequence[Any],
    *,
    logprob_fn: LogprobFn,
    ref_params: Any,
    frozen: Any,
    pad_id: int,
    data_config: Any,
    batch_size: int,
    place: Callable[[PreferenceBatch], PreferenceBatch] | None = None,
) -> tuple[Any, Any]:
    """The reference's sequence log-probs of every example, computed once before training
    (`config.precompute_reference`; TRL's `precompute_ref_log_probs`).

    The examples go through `reference_logprobs` (LD-DPO's sums with `config.ld_alpha`) in
    batches of `batch_size`, longest first so that each batch pads little; a short last batch
    is filled with repeats of its first example, whose results are dropped. Put the rows of a
    step's batch into it with `batch._replace(ref_chosen_logp=table_c[rows],
    ref_rejected_logp=table_r[rows])`; `prepare_preference_batch` then keeps them.

    Args:
      config: the preference config (its `chunk_size`, `ld_alpha`, `shared_prompt`).
      examples: tokenized paired examples (`load_preference_data`).
      logprob_fn: the jitted forward (as for `prepare_preference_batch`).
      ref_params: the reference's trainable parameters.
      frozen: the frozen policy parameters.
      pad_id: the tokenizer's pad id.
      data_config: the `PreferenceDataConfig` that buckets the batches.
      batch_size: examples per forward.
      place: applied to each batch before the forward (e.g. a `jax.device_put` onto a mesh);
        None: as built.

    Returns:
      `(ref_chosen_logp[n], ref_rejected_logp[n])`, NumPy float32, in the order of `examples`.

    Examples:
      >>> from jaxrl_llm.data import PreferenceDataConfig, load_preference_data
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> pairs = [{"prompt": "1+1=", "chosen": "2", "rejected": "3"},
      ...          {"prompt": "12+30=", "chosen": "42", "rejected": "4"}]
      >>> data = PreferenceDataConfig(bucket_minimum=4)
      >>> examples, _, _ = load_preference_data(pairs, tokenizer=ByteTokenizer(), config=data)
      >>> fn = lambda p, f, s: -jnp.ones(s.completion_mask.shape) * s.completion_mask
      >>> c, r = precompute_reference_logprobs(PreferenceConfig(), examples, logprob_fn=fn,
      ...     ref_params=None, frozen=None, pad_id=0, data_config=data, batch_size=2)
      >>> c.tolist(), r.tolist()  # −(completion tokens + EOS)
      ([-2.0, -3.0], [-2.0, -2.0])
    """
    import numpy as np

    from jaxrl_llm.data.preference import make_preference_batch

    if not config.paired:
        raise ValueError("precompute_reference_logprobs: KTO's examples are unpaired.")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(
            f"precompute_reference_logprobs: `batch_size` must be a positive int, got "
            f"{batch_size!r}."
        )
    n = len(examples)
    order = sorted(range(n), key=lambda i: (-len(examples[i].prompt), -_longest(examples[i]), i))
    chosen, rejected = np.zeros(n, np.float32), np.zeros(n, np.float32)
    for first in range(0, n, batch_size):
        rows = order[first : first + batch_size]
        filled = rows + [rows[0]] * (batch_size - len(rows))
        batch = make_preference_batch(
            [examples[i] for i in filled], pad_id=pad_id, config=data_config
        )
        batch = pack_preference_batch(config, batch, pad_id=pad_id)  # with `packing`
        if place is not None:
            batch = place(batch)
        c, r = _sequence_sums(config, logprob_fn, ref_params, frozen, batch)
        c, r = fetch_global((c, r))  # every process reads the whole table
        chosen[rows] = np.asarray(c)[: len(rows)]
        rejected[rows] = np.asarray(r)[: len(rows)]
    return chosen, rejected


def _sequence_sums(
    config: PreferenceConfig, logprob_fn: LogprobFn, params: Any, frozen: Any, batch: Any
) -> tuple[jax.Array, jax.Array | None]:
    """`reference_logprobs` with the config's LD-DPO α and shared-prompt setting."""
    return reference_logprobs(
        logprob_fn,
        params,
        frozen,
        batch,
        ld_alpha=config.ld_alpha,
        shared_prompt=config.shared_prompt,
    )


def pack_preference_batch(
    config: Any, batch: PreferenceBatch, *, parts: int = 1, pad_id: int = 0
) -> PreferenceBatch:
    """The batch with its pairs packed (`PreferenceConfig.packing` or
    `RewardModelConfig.packing`: `pack_pairs`), or as it is
    without `packing` or under a mesh of several devices (where the forwards run the padded
    rows: `joint_token_logprobs`). Host NumPy, before `prepare_preference_batch`.

    Args:
      config: the preference or reward-model config (`packing`, `packing_length`).
      batch: a padded paired batch (`make_preference_batch`).
      parts: the update step's micro-batches (`minibatches × accumulation_steps`): each
        micro-batch's pairs get rows of their own. A whole-batch forward (evaluation) packs
        with 1.
      pad_id: the tokenizer's pad id.

    Examples:
      >>> import numpy as np
      >>> s = SequenceBatch(np.array([[5, 6, 7, 0]] * 4), np.array([[1, 1, 1, 0]] * 4),
      ...                   np.array([[1, 0]] * 4))
      >>> cfg = PreferenceConfig(packing=True, packing_length=8)
      >>> b = pack_preference_batch(cfg, PreferenceBatch(s, s), parts=2)  # 4 tokens a pair
      >>> b.packed.tokens.shape, b.packed.batch_row.tolist()  # a row per micro-batch
      ((2, 8), [0, 1, 0, 1])
    """
    if not config.packing or not plain_layout():
        return batch
    if batch.rejected is None:
        raise ValueError("pack_preference_batch: packing lays out pairs; the batch has none.")
    packed = pack_pairs(
        batch.chosen,
        batch.rejected,
        parts=parts,
        length=config.packing_length,
        pad_id=pad_id,
    )
    return batch._replace(packed=packed)


def _longest(example: Any) -> int:
    return max(len(example.chosen), len(example.rejected or ()))


def prepare_preference_batch(
    config: PreferenceConfig,
    batch: PreferenceBatch,
    *,
    logprob_fn: LogprobFn,
    policy_params: Any,
    ref_params: Any,
    frozen: Any,
    reward_moments: losses.RunningMoments | None = None,
) -> tuple[PreferenceBatch, losses.RunningMoments | None]:
    """Fill in what the loss needs before the step: reference log-probs, KTO's `z`, BCO's `δ`.

    * reference log-probs (`reference_logprobs`) unless the loss is reference-free or the batch
      already carries them (`precompute_reference_logprobs`; `ref_params` may then be None);
    * KTO (`loss_type="kto"`): `z = losses.kto_reference_point` over the mismatched pairs
      `kto_kl_sequences(batch.chosen)`, scored by the policy and the reference (no gradient;
      TRL's batch KL estimate), stored in every row of `kl_reference_point`;
    * BCO: the implicit rewards `β·(π − ref)` of the batch's chosen and rejected responses
      under the current policy update the running moments (TRL updates them before the loss);
      their mean is `reward_shift`. A batch that carries its `reward_shift` keeps it, and
      the moments stay as they are (an evaluation at the shift training reached).

    Args:
      config: the preference config.
      batch: a `PreferenceBatch` (NumPy or JAX arrays).
      logprob_fn: the jitted forward (`make_logprob_fn(graphs.policy, chunk_size=...)`, with
        `group_size=2` when `config.shared_prompt`).
      policy_params: the current trainable policy parameters (`state.params["policy"]`).
      ref_params: the reference's trainable-subset parameters (`reference_params(...)`).
      frozen: the frozen policy parameters (`state.frozen["policy"]`).
      reward_moments: BCO's running moments (`losses.init_running_moments()` at the start).

    Returns:
      `(batch, reward_moments)`: the batch as JAX arrays with the fields set, and the updated
      moments (None unless BCO).

    Examples:
      >>> import jax.numpy as jnp
      >>> fn = lambda p, f, s: -p * s.completion_mask  # a "model" whose log-probs are −p
      >>> s = SequenceBatch(jnp.ones((2, 4), jnp.int32), jnp.ones((2, 4)), jnp.ones((2, 2)))
      >>> b, _ = prepare_preference_batch(PreferenceConfig(loss="kto"),
      ...     PreferenceBatch(s, labels=jnp.array([1.0, 0.0])), logprob_fn=fn,
      ...     policy_params=0.5, ref_params=1.0, frozen=None)
      >>> b.ref_chosen_logp.tolist(), b.kl_reference_point.tolist()  # z = max(−1 − (−2), 0)
      ([-2.0, -2.0], [1.0, 1.0])
    """
    where = "prepare_preference_batch"
    batch = jax.tree.map(jnp.asarray, batch)
    N = batch.chosen.tokens.shape[0]
    if config.shared_prompt and not isinstance(batch.chosen.tokens, jax.core.Tracer):
        check_shared_prompts(batch, where=where)  # eager calls; jitted callers build the pairs
    if config.uses_reference and batch.ref_chosen_logp is None:
        ref_c, ref_r = _sequence_sums(config, logprob_fn, ref_params, frozen, batch)
        batch = batch._replace(ref_chosen_logp=ref_c, ref_rejected_logp=ref_r)
    if config.needs_reference_point:
        if N < 2:
            raise ValueError(
                f"{where}: KTO's reference point needs mismatched pairs within the batch: at "
                f"least 2 rows, got {N}."
            )
        kl_seqs = kto_kl_sequences(batch.chosen)
        m = jnp.asarray(kl_seqs.completion_mask)
        kl_logp = losses.sequence_logprob(logprob_fn(policy_params, frozen, kl_seqs), m)
        kl_ref = losses.sequence_logprob(logprob_fn(ref_params, frozen, kl_seqs), m)
        z = losses.kto_reference_point(kl_logp, kl_ref, valid=_has_tokens(m))
        batch = batch._replace(kl_reference_point=jnp.full((N,), z, jnp.float32))
    if config.loss == "bco" and batch.reward_shift is None:
        if reward_moments is None:
            raise ValueError(
                f"{where}: loss 'bco' needs `reward_moments` (losses.init_running_moments() at "
                "the start of training, then the returned moments)."
            )
        pi_c, pi_r = _sequence_sums(config, logprob_fn, policy_params, frozen, batch)
        beta = 0.1 if config.beta is None else config.beta  # bco_loss's default β
        rewards = beta * jnp.concatenate(
            [pi_c - batch.ref_chosen_logp, pi_r - batch.ref_rejected_logp]
        )
        valid = pair_valid(batch)
        reward_moments = losses.running_moments_update(
            reward_moments, rewards, jnp.concatenate([valid, valid])
        )
        batch = batch._replace(reward_shift=jnp.full((N,), reward_moments.mean, jnp.float32))
    return batch, reward_moments


def train_preference(
    policy: nnx.Module,
    tokenizer: Any,
    data: str | pathlib.Path | Sequence[Any],
    config: PreferenceConfig,
    optim_config: Any,
    *,
    steps: int,
    batch_size: int,
    seed: int = 0,
    data_config: Any = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    trainable: tuple[str, ...] = (),
    frozen: tuple[str, ...] = (),
) -> tuple[nnx.Module, list[dict[str, float]]]:
    """One complete offline preference run: load, tokenize, batch, prepare, update; no I/O else.

    The reference model is the initial policy (a copy of its trainable parameters, sharing the
    frozen ones). Each step draws `batch_size` examples in a seeded, reshuffled-every-epoch order
    (`jaxrl_llm.data.next_batch`), builds a bucketed fixed-shape `PreferenceBatch`
    (`jaxrl_llm.data.make_preference_batch`; its pairs packed with `config.packing`), fills it
    with `prepare_preference_batch` and runs
    the compiled update step (`config.epochs × config.minibatches` updates,
    `optim_config.accumulation_steps` micro-batches each). Checkpoints, logging and a CLI are the
    runner's (`jaxrl_llm.runner`).

    Args:
      policy: the policy `Decoder` (its arrays are donated to the train state: use the returned
        model afterwards).
      tokenizer: a `jaxrl_llm.tokenizer` tokenizer.
      data: a JSONL path, or records (`{"prompt", "chosen", "rejected"}`; for KTO
        `{"prompt", "completion", "label"}`), or `TokenizedPreference`s.
      config: the `PreferenceConfig`.
      optim_config: the `OptimConfig` (`optim:` section).
      steps: update steps (batches).
      batch_size: rows per batch (pairs; KTO: examples).
      seed: data order, minibatch shuffling.
      data_config: `jaxrl_llm.data.PreferenceDataConfig` (None: its defaults).
      on_step: called as `on_step(step, metrics)` after every step.
      trainable, frozen: regexes of the parameter paths to train / to freeze (`split_models`;
        paths start with `policy.`); () trains every parameter. A LoRA-adapted model trains
        its adapters alone with `trainable=(LORA_PATTERN,)` (`jaxrl_llm.models`).

    Returns:
      `(model, history)`: the trained policy (a new module) and one dict of float metrics per
      step (the step's `pref/…`, `loss/…`, `optim/…` metrics).

    Examples:
      >>> from jaxrl_llm.data import ArithmeticConfig, arithmetic_preference_records
      >>> from jaxrl_llm.models import Decoder, ModelConfig
      >>> from jaxrl_llm.tokenizer import ByteTokenizer
      >>> from jaxrl_llm.train import OptimConfig
      >>> cfg = ModelConfig(family="qwen3", vocab_size=259, hidden_size=16, intermediate_size=32,
      ...                   num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8)
      >>> records = arithmetic_preference_records(ArithmeticConfig(max_digits=1, train_size=8),
      ...                                         seed=0)
      >>> model, history = train_preference(Decoder(cfg, rngs=nnx.Rngs(0)), ByteTokenizer(),
      ...     records, PreferenceConfig(loss="dpo"), OptimConfig(learning_rate=1e-3),
      ...     steps=2, batch_size=4)
      >>> len(history), "pref/accuracy" in history[0]
      (2, True)
    """
    from jaxrl_llm.train.logprobs import make_logprob_fn
    from jaxrl_llm.train.optim import make_optimizer
    from jaxrl_llm.train.params import reference_params, split_models
    from jaxrl_llm.train.state import init_train_state
    from jaxrl_llm.train.update import make_update_step

    examples, data_config = _offline_examples(
        "train_preference", data, tokenizer, data_config, steps, batch_size, not config.paired
    )
    graphs, params, fixed = split_models(policy, trainable=trainable, frozen=frozen)
    tx = make_optimizer(optim_config)
    moments = losses.init_running_moments() if config.loss == "bco" else None
    state = init_train_state(params, fixed, tx, key=jax.random.key(seed), reward_moments=moments)
    ref = reference_params(state.params)
    logprob_fn = make_logprob_fn(
        graphs.policy, chunk_size=config.chunk_size, group_size=config.prompt_group_size
    )
    update = make_update_step(
        preference_objective(config, graphs),
        tx,
        epochs=config.epochs,
        minibatches=config.minibatches,
        accumulation_steps=optim_config.accumulation_steps,
        shuffle=config.shuffle,
    )

    parts = config.minibatches * optim_config.accumulation_steps

    def step(state: Any, batch: PreferenceBatch) -> tuple[Any, dict[str, jax.Array]]:
        batch = pack_preference_batch(config, batch, parts=parts, pad_id=tokenizer.pad_id)
        batch, moments = prepare_preference_batch(
            config,
            batch,
            logprob_fn=logprob_fn,
            policy_params=state.params["policy"],
            ref_params=ref,
            frozen=state.frozen["policy"],
            reward_moments=state.reward_moments,
        )
        return update(state._replace(reward_moments=moments), batch)

    fill = None
    if config.precompute_reference:  # the reference's table, then no reference forward
        table = precompute_reference_logprobs(
            config,
            examples,
            logprob_fn=logprob_fn,
            ref_params=ref,
            frozen=state.frozen["policy"],
            pad_id=tokenizer.pad_id,
            data_config=data_config,
            batch_size=batch_size,
        )
        ref = None

        def fill(batch: PreferenceBatch, rows: Any) -> PreferenceBatch:
            return batch._replace(ref_chosen_logp=table[0][rows], ref_rejected_logp=table[1][rows])

    state, history = _offline_steps(
        state, step, examples, tokenizer, data_config, steps, batch_size, seed, on_step, fill
    )
    model = nnx.merge(graphs.policy, state.params["policy"], state.frozen["policy"])
    return model, history


def _offline_examples(
    where: str,
    data: Any,
    tokenizer: Any,
    data_config: Any,
    steps: int,
    batch_size: int,
    unpaired: bool,
) -> tuple[list[Any], Any]:
    """The checked run length and the tokenized examples of an offline run
    (`train_preference`, `train_reward_model`), with the data config used."""
    from jaxrl_llm.data.preference import PreferenceDataConfig, load_preference_data

    for name, value in (("steps", steps), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: `{name}` must be a positive int, got {value!r}.")
    data_config = PreferenceDataConfig() if data_config is None else data_config
    examples, _, _ = load_preference_data(
        data, tokenizer=tokenizer, config=data_config, unpaired=unpaired
    )
    return examples, data_config


def _offline_steps(
    state: Any,
    step: Callable[[Any, PreferenceBatch], tuple[Any, dict[str, jax.Array]]],
    examples: list[Any],
    tokenizer: Any,
    data_config: Any,
    steps: int,
    batch_size: int,
    seed: int,
    on_step: Callable[[int, dict[str, float]], None] | None,
    fill: Callable[[PreferenceBatch, Any], PreferenceBatch] | None = None,
) -> tuple[Any, list[dict[str, float]]]:
    """`steps` calls of `step(state, batch)` on bucketed batches of `batch_size` examples in
    a seeded order reshuffled every epoch (`fill(batch, rows)` first, if given: the
    precomputed reference log-probs of the rows); `(state, history of float metrics)`."""
    from jaxrl_llm.data import IteratorState, next_batch
    from jaxrl_llm.data.preference import make_preference_batch

    order = IteratorState(seed=seed, epoch=0, position=0)
    history: list[dict[str, float]] = []
    for i in range(steps):
        rows, order = next_batch(order, num_examples=len(examples), batch_size=batch_size)
        batch = make_preference_batch(
            [examples[j] for j in rows], pad_id=tokenizer.pad_id, config=data_config
        )
        if fill is not None:
            batch = fill(batch, rows)
        state, metrics = step(state, batch)
        record = {k: float(v) for k, v in jax.device_get(metrics).items()}
        history.append(record)
        if on_step is not None:
            on_step(i, record)
    return state, history
