"""One sampling step: temperature, top-k, top-p and min-p filters, the draw, and its log-probs.

All functions take float32 logits `[N, V]` and static (Python) settings, so a setting that is
off costs nothing: no `[N, V]` sort unless top-p is on (and then only over the `k` survivors
when top-k is on too). Filters return logits with removed tokens set to `-inf`; they never
renormalise explicitly (the softmax of the kept logits is the renormalised distribution).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array


class Draw(NamedTuple):
    """The tokens of one step and their float32 log-probs, each `[N]`.

    `logprobs` is `log softmax(z/τ)[y]`, the unfiltered policy at the sampling temperature (what
    `losses.token_logprobs(..., temperature=τ)` of a fresh forward gives); `sampling_logprobs`
    is the log-prob under the distribution actually sampled from (after top-k/top-p/min-p). They
    are equal when no filter is on. Greedy: `logprobs` at τ = 1 and `sampling_logprobs` = 0.
    """

    tokens: Array  # [N] int32
    logprobs: Array  # [N] float32
    sampling_logprobs: Array  # [N] float32


def filter_logits(
    scaled: Array,
    *,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> Array:
    """Temperature-scaled logits `[N, V]` with tokens outside top-k / top-p / min-p set to -inf.

    Applied in the order top-k → top-p → min-p, each on what the previous one kept:

        top-k:  keep z_v >= (k-th largest z)
        top-p:  sort descending, q = softmax; keep the tokens whose exclusive cumulative mass
                Σ_{u before v} q_u < p (the smallest prefix reaching p; never empty)
        min-p:  keep z_v >= max z + log(min_p)   (⟺ p(v) >= min_p · max p)

    Ties at a cut-off are kept (the kept set can exceed k by the number of ties).

    Args:
      scaled: float32 `[N, V]`, already divided by the temperature.
      top_k: None or k >= 1 (k >= V is a no-op).
      top_p: None or p in (0, 1] (p = 1 is a no-op).
      min_p: None or a value in [0, 1] (0 is a no-op).

    Returns:
      `[N, V]` float32, `-inf` where a token was removed.

    Examples:
      >>> z = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
      >>> jnp.isfinite(filter_logits(z, top_k=3)).astype(int)
      Array([[1, 1, 1, 0]], dtype=int32)
      >>> jnp.isfinite(filter_logits(z, top_p=0.8)).astype(int)
      Array([[1, 1, 0, 0]], dtype=int32)
      >>> jnp.isfinite(filter_logits(z, min_p=0.2)).astype(int)
      Array([[1, 1, 1, 0]], dtype=int32)
      >>> tied = jnp.array([[2.0, 0.0, 0.0, 0.0]])  # top-k keeps the three ties of its 2nd value
      >>> jnp.isfinite(filter_logits(tied, top_k=2, top_p=0.85)).astype(int)
      Array([[1, 1, 1, 1]], dtype=int32)
    """
    if scaled.ndim != 2:
        raise ValueError(f"filter_logits: `scaled` must be [N, V], got shape {scaled.shape}.")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"filter_logits: `top_k` must be None or an int >= 1, got {top_k!r}.")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"filter_logits: `top_p` must be None or in (0, 1], got {top_p!r}.")
    if min_p is not None and not 0 <= min_p <= 1:
        raise ValueError(f"filter_logits: `min_p` must be None or in [0, 1], got {min_p!r}.")
    V = scaled.shape[-1]
    neg_inf = jnp.asarray(-jnp.inf, scaled.dtype)
    top_values = None  # descending values of the top-k survivors [N, k], reused by top-p
    if top_k is not None and top_k < V:
        top_values = jax.lax.top_k(scaled, top_k)[0]
        scaled = jnp.where(scaled >= top_values[:, -1:], scaled, neg_inf)
    if top_p is not None and top_p < 1.0:
        ordered = top_values if top_values is not None else -jnp.sort(-scaled, axis=-1)
        # normalised over every survivor of top-k: tokens tied with the k-th value survive too
        # and sit after `ordered`'s entries in the order, so the mass before those is exact
        probs = jnp.exp(ordered - jax.nn.logsumexp(scaled, axis=-1, keepdims=True))
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        count = jnp.maximum(jnp.sum(mass_before < top_p, axis=-1, keepdims=True), 1)
        cutoff = jnp.take_along_axis(ordered, count - 1, axis=-1)
        scaled = jnp.where(scaled >= cutoff, scaled, neg_inf)
    if min_p:
        cutoff = jnp.max(scaled, axis=-1, keepdims=True) + jnp.log(jnp.float32(min_p))
        scaled = jnp.where(scaled >= cutoff, scaled, neg_inf)
    return scaled


def _picked(logits: Array, tokens: Array) -> Array:
    return jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]


def row_uniforms(keys: Array, steps: int) -> Array:
    """`[N, steps]` float32 uniforms in (0, 1]: entry `(n, t)` is drawn with `fold_in(keys[n], t)`.

    Drawn once before the decode loop (one batched threefry call instead of one per step). Entry
    `(n, t)` depends only on row `n`'s key and `t`, not on the batch or on `steps`.

    Examples:
      >>> keys = jax.random.split(jax.random.key(0), 2)
      >>> a, b = row_uniforms(keys, 3), row_uniforms(keys[1:], 5)
      >>> a.shape, bool(jnp.all(a[1] == b[0, :3]))
      ((2, 3), True)
    """

    def one(key: Array, t: Array) -> Array:
        return 1.0 - jax.random.uniform(jax.random.fold_in(key, t), (), jnp.float32)

    t = jnp.arange(steps, dtype=jnp.uint32)
    return jax.vmap(lambda key: jax.vmap(one, in_axes=(None, 0))(key, t))(keys)


def _invert_cdf(filtered: Array, top: Array, uniforms: Array) -> Array:
    """`[N]` int32: per row, the token where the running sum `C` of the weights
    `exp(filtered − top)` first reaches `u · C_V`, never a token the filters removed (−inf).

    XLA's `cumsum` rounds neighbouring prefix sums differently, so in float32 `C` is not
    monotone over a large vocabulary: it dips and rises by a few ulps, also across removed
    tokens, and counting `C_v < u · C_V` can land on one (measured on XLA:CPU at V = 151,936:
    about 2e-7 of the draws under top-k 50, 2e-6 under min-p 0.05; its log-prob is −inf).
    When a row of the batch lands on one, the batch is drawn again among the tokens of
    positive weight only: the first with `C_v >= u · C_V`, or the row's last where rounding
    leaves none (u close to 1). The check reads one logit per row; the second draw runs only
    for such a batch (`lax.cond`, whose branch recomputes the weights from `filtered`: passing
    the `[N, V]` weights into it would make XLA keep them in memory for every draw).
    """

    def running_sum() -> tuple[Array, Array]:
        weights = jnp.exp(filtered - top)
        return weights, jnp.cumsum(weights, axis=-1)

    _, cdf = running_sum()
    target = uniforms[:, None] * cdf[:, -1:]
    tokens = jnp.minimum(jnp.sum(cdf < target, axis=-1, dtype=jnp.int32), filtered.shape[-1] - 1)
    removed = _picked(filtered, tokens) == -jnp.inf

    def among_kept() -> Array:
        weights, cdf = running_sum()  # the same computation: the same rounding
        kept = weights > 0
        hit = kept & (cdf >= target)
        index = jax.lax.broadcasted_iota(jnp.int32, weights.shape, 1)
        last_kept = jnp.max(jnp.where(kept, index, 0), axis=-1)
        first_hit = jnp.argmax(hit, axis=-1).astype(jnp.int32)
        return jnp.where(removed, jnp.where(jnp.any(hit, axis=-1), first_hit, last_kept), tokens)

    return jax.lax.cond(jnp.any(removed), among_kept, lambda: tokens)


def draw_tokens(
    logits: Array,
    uniforms: Array | None,
    *,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> Draw:
    """Sample one token per row from float32 `logits[N, V]` by inverting the row's CDF.

    With `q` the filtered, temperature-scaled distribution (`filter_logits`) and `u_n` in (0, 1]
    the row's uniform, the token is the first `v` with `q_v > 0` and `C_v >= u_n · C_V`, where
    `C_v = Σ_{w<=v} exp(z'_w − max z')` (inverse-transform sampling: `P(v) = q_v`; tokens with
    `q_v = 0` are never chosen, even where float32 rounding makes the running sum dip or rise
    across them, `_invert_cdf`). One uniform per row and step replaces the `V` Gumbel draws of
    the Gumbel-max trick. `temperature = 0` takes the argmax of the logits (uniforms unused).

    Args:
      logits: float32 `[N, V]` next-token logits.
      uniforms: `[N]` float32 in (0, 1] (see `row_uniforms`); None when greedy.
      temperature: τ >= 0 (static).
      top_k, top_p, min_p: static filter settings, see `filter_logits`.

    Returns:
      A `Draw` of `[N]` tokens (int32), `logprobs` (unfiltered, at τ) and `sampling_logprobs`.

    Examples:
      >>> z = jnp.log(jnp.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]))
      >>> draw_tokens(z, jnp.array([0.75, 0.05]), temperature=1.0).tokens
      Array([1, 0], dtype=int32)
      >>> draw_tokens(z, jnp.array([0.75, 0.05]), temperature=0.0).tokens
      Array([0, 2], dtype=int32)
    """
    if temperature != 0.0 and uniforms is None:
        raise ValueError("draw_tokens: sampling with temperature > 0 needs `uniforms` [N].")
    if temperature == 0.0:
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        logprobs = _picked(logits, tokens) - jax.nn.logsumexp(logits, axis=-1)
        return Draw(tokens, logprobs, jnp.zeros_like(logprobs))
    scaled = logits / jnp.float32(temperature)
    filtered = filter_logits(scaled, top_k=top_k, top_p=top_p, min_p=min_p)
    top = jax.lax.stop_gradient(jnp.max(filtered, axis=-1, keepdims=True))
    tokens = _invert_cdf(filtered, top, uniforms)
    weights = jnp.exp(filtered - top)  # [N, V], 0 on removed tokens
    # The log-probs use a sum (a tree reduction), not the running sum's last entry, whose
    # float32 rounding error grows with V.
    log_total = jnp.log(jnp.sum(weights, axis=-1))
    sampling_logprobs = _picked(filtered, tokens) - top[:, 0] - log_total
    if filtered is scaled:
        return Draw(tokens, sampling_logprobs, sampling_logprobs)
    logprobs = _picked(scaled, tokens) - jax.nn.logsumexp(scaled, axis=-1)
    return Draw(tokens, logprobs, sampling_logprobs)
