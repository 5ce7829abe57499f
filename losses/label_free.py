"""Label-free rewards from agreement within a group: majority-vote pseudo-labels (ALGORITHMS.md §10.5).

Answers are integer ids (the host maps each extracted final answer to an id, equal answers to
equal ids; what "equal" means — exact match, symbolic equivalence — is the host's choice). Groups
are rows of `[B,G]` (contiguous groups, `losses.to_groups`). Rewards run under stop-gradient (§0.6).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from losses._rewards import check_integer, optional_flags, sg


def _answers(x: ArrayLike, name: str, *, where: str) -> Array:
    check_integer(x, name, where=where)
    a = jnp.asarray(x)
    if a.ndim != 2:
        raise ValueError(f"{where}: `{name}` must be [B,G], got shape {a.shape}.")
    return a


def majority_vote_rewards(
    answer_ids: ArrayLike,
    *,
    valid: ArrayLike | None = None,
    vote_ids: ArrayLike | None = None,
    vote_valid: ArrayLike | None = None,
) -> Array:
    """Reward agreement with the group's majority answer (TTRL; ALGORITHMS.md §10.5).

        count(c) = Σ_j [v_j = c]·valid_j               over the voters v of the group
        mode     = argmax_c count(c)                    ties: first occurrence in voter order
        r_g      = [a_g = mode]·valid_g                 (0 for a group without valid voters)

    The voters are the group's own answers, or `vote_ids` (e.g. answers to a paraphrased question,
    Co-Reward). Invalid (unparsable) answers neither vote nor win.

    Sources: "TTRL: Test-Time Reinforcement Learning" (arXiv 2504.16084); MM-UPT ("Unsupervised
    Post-Training for Multi-Modal LLM Reasoning via GRPO"), Co-Reward ("Self-supervised
    Reinforcement Learning for Large Language Model Reasoning via Contrastive Agreement"), TraPO
    (seed papers). No peer.

    Args:
      answer_ids: `int[B,G]` answer ids of the samples.
      valid: optional `[B,G]` bool, False for unparsable answers.
      vote_ids: optional `int[B,G']` answer ids of the voters (default: `answer_ids`).
      vote_valid: optional `[B,G']` bool for `vote_ids` (default: `valid` when the group votes
        itself, all True otherwise).

    Returns:
      `[B,G]` float32 {0,1} rewards, under stop-gradient.

    Examples:
      >>> import jax.numpy as jnp
      >>> a = jnp.array([[3, 5, 3, -1, 5]])
      >>> ok = jnp.array([[True, True, True, False, True]])
      >>> majority_vote_rewards(a, valid=ok).tolist()
      [[1.0, 0.0, 1.0, 0.0, 0.0]]
    """
    where = "majority_vote_rewards"
    a = _answers(answer_ids, "answer_ids", where=where)
    a_ok = optional_flags(valid, a.shape, "valid", where=where)
    if vote_ids is None:
        if vote_valid is not None:
            raise ValueError(
                f"{where}: `vote_valid` needs `vote_ids`; without them the group votes itself "
                "with `valid`."
            )
        v, v_ok = a, a_ok
    else:
        v = _answers(vote_ids, "vote_ids", where=where)
        if v.shape[0] != a.shape[0]:
            raise ValueError(
                f"{where}: `vote_ids` must be [B,G'] with B = {a.shape[0]}, got shape {v.shape}."
            )
        v_ok = optional_flags(vote_valid, v.shape, "vote_valid", where=where)
    same = (v[:, :, None] == v[:, None, :]) & v_ok[:, None, :]  # [B, voter j, voter i]
    count = jnp.where(v_ok, jnp.sum(same, axis=-1), -1)  # invalid voters never hold the mode
    winner = jnp.argmax(count, axis=-1)  # first maximum = first occurrence of a tied answer
    mode = jnp.take_along_axis(v, winner[:, None], axis=-1)
    has_vote = jnp.any(v_ok, axis=-1, keepdims=True)
    return sg(((a == mode) & a_ok & has_vote).astype(jnp.float32))
