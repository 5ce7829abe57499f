"""Reward functions on token arrays, in `jnp` only: they run inside `jax.jit` / `lax.scan`.

For the built-in tasks (`jaxrl_llm.data.tasks`) the reward needs no text: a completion is
correct when its tokens before the first stop token are exactly the answer's tokens. With this
the whole RL iteration (sample → score → advantages → update) can be one compiled program.

Conventions (those of the sampler's `Rollout`): `completion_tokens[N, T]` int,
`completion_mask[N, T]` (bool or {0,1}; True on generated tokens, including the stop token).
The mask may have holes: the valid tokens are read in order, as `decode_completions` does, so
the text verifier `builtin.exact_answer` on the decoded completions gives the same reward.
With the `ByteTokenizer` the token form of a plain-text answer is unique, so the two agree (an
answer holding a special token's rendered name, `<pad>` or `<id:N>`, or the replacement
character of invalid bytes is the exception: decoding writes that text for other tokens); with a
subword tokenizer the JAX reward compares against the answer's canonical tokenization only.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from jaxrl_llm.rewards.decode import _stop_id_tuple


def _stop_array(stop_ids: int | Sequence[int], where: str) -> Array:
    return jnp.asarray(_stop_id_tuple(stop_ids, where), jnp.int32)


def _check_tokens(tokens: ArrayLike, mask: ArrayLike, where: str) -> tuple[Array, Array]:
    tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
    if tokens.ndim != 2:
        raise ValueError(f"{where}: `completion_tokens` must be [N, T], got shape {tokens.shape}.")
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(
            f"{where}: `completion_tokens` must be integer ids, got dtype {tokens.dtype}."
        )
    if mask.shape != tokens.shape:
        raise ValueError(
            f"{where}: `completion_mask` must have the tokens' shape {tokens.shape}, got {mask.shape}."
        )
    return tokens.astype(jnp.int32), mask > 0


def completion_content(
    completion_tokens: ArrayLike,
    completion_mask: ArrayLike,
    *,
    stop_ids: int | Sequence[int],
) -> tuple[Array, Array]:
    """The valid tokens of each row, compacted to the left and cut at the first stop token.

        c_n = (y_nt : m_nt = 1, in order of t),   len_n = index in c_n of the first stop id
                                                   (|c_n| if there is none)

    Args:
      completion_tokens: `[N, T]` int token ids.
      completion_mask: `[N, T]` bool / {0,1}.
      stop_ids: the stop token id(s) (EOS), e.g. `tokenizer.eos_id`.

    Returns:
      `(content[N, T] int32, lengths[N] int32)`: `content[n, :lengths[n]]` are the tokens
      before the stop; the rest of the row is −1.

    Examples:
      >>> tokens = jnp.array([[49, 57, 258, 256], [55, 9, 56, 50]])
      >>> mask = jnp.array([[1, 1, 1, 0], [1, 0, 1, 1]])
      >>> content, lengths = completion_content(tokens, mask, stop_ids=258)
      >>> content.tolist(), lengths.tolist()
      ([[49, 57, -1, -1], [55, 56, 50, -1]], [2, 3])
    """
    where = "completion_content"
    tokens, valid = _check_tokens(completion_tokens, completion_mask, where)
    stops = _stop_array(stop_ids, where)
    T = tokens.shape[1]
    # a stable sort of each row's validity moves its valid tokens to the left, in order: a
    # row-wise gather (no scatter into a fresh buffer), so rows split over a mesh stay local
    order = jnp.argsort(~valid, axis=1, stable=True)
    count = jnp.sum(valid, axis=1, dtype=jnp.int32)
    cols = jnp.arange(T)[None, :]
    packed = jnp.where(cols < count[:, None], jnp.take_along_axis(tokens, order, axis=1), -1)
    is_stop = jnp.isin(packed, stops) & (cols < count[:, None])
    first_stop = jnp.where(jnp.any(is_stop, axis=1), jnp.argmax(is_stop, axis=1), count)
    lengths = first_stop.astype(jnp.int32)
    content = jnp.where(cols < lengths[:, None], packed, -1)
    return content, lengths


def exact_answer_reward(
    completion_tokens: ArrayLike,
    completion_mask: ArrayLike,
    answer_tokens: ArrayLike,
    answer_lengths: ArrayLike,
    *,
    stop_ids: int | Sequence[int],
) -> Array:
    """1.0 where the completion's tokens before the first stop are exactly the answer's tokens.

        r_n = [len_n = a_n] · Π_{j < a_n} [c_nj = ans_nj]      (c, len from `completion_content`)

    The token twin of `jaxrl_llm.rewards.builtin.exact_answer`: `"19"` then EOS is correct for
    the answer `"19"`; `"19 "`, `"019"`, `"1"`, `"191"` are not; tokens after the stop token
    do not matter; a completion that never stops is judged on all its valid tokens.

    Args:
      completion_tokens: `[N, T]` int.
      completion_mask: `[N, T]` bool / {0,1}.
      answer_tokens: `[N, A]` int, the answer of each row's prompt, padded after `answer_lengths`
        (repeat a `[B, A]` batch over the group with `jnp.repeat(answer_tokens, G, axis=0)`).
      answer_lengths: `[N]` int, answer tokens that count.
      stop_ids: the stop token id(s).

    Returns:
      `[N]` float32 in {0, 1}.

    Examples:
      >>> tokens = jnp.array([[49, 57, 258], [49, 57, 57], [48, 49, 57]])
      >>> mask = jnp.array([[1, 1, 1], [1, 1, 1], [1, 1, 1]])
      >>> answer = jnp.array([[49, 57]] * 3)
      >>> exact_answer_reward(tokens, mask, answer, jnp.array([2, 2, 2]), stop_ids=258).tolist()
      [1.0, 0.0, 0.0]
    """
    where = "exact_answer_reward"
    content, lengths = completion_content(completion_tokens, completion_mask, stop_ids=stop_ids)
    answer = jnp.asarray(answer_tokens)
    answer_len = jnp.asarray(answer_lengths)
    N, T = content.shape
    if answer.ndim != 2 or answer.shape[0] != N:
        raise ValueError(f"{where}: `answer_tokens` must be [N={N}, A], got shape {answer.shape}.")
    if not jnp.issubdtype(answer.dtype, jnp.integer):
        raise ValueError(f"{where}: `answer_tokens` must be integer ids, got dtype {answer.dtype}.")
    if answer_len.shape != (N,) or not jnp.issubdtype(answer_len.dtype, jnp.integer):
        raise ValueError(
            f"{where}: `answer_lengths` must be [N={N}] integers, got shape {answer_len.shape} "
            f"and dtype {answer_len.dtype}."
        )
    A = answer.shape[1]
    width = max(T, A)
    content = jnp.pad(content, ((0, 0), (0, width - T)), constant_values=-1)
    answer = jnp.pad(answer.astype(jnp.int32), ((0, 0), (0, width - A)), constant_values=-1)
    in_answer = jnp.arange(width)[None, :] < answer_len[:, None]
    same = jnp.all(jnp.where(in_answer, content == answer, True), axis=1)
    correct = same & (lengths == answer_len) & (answer_len <= A)
    return jax.lax.stop_gradient(correct.astype(jnp.float32))
