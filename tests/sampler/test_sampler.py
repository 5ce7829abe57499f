"""The compiled sampler against uncached forward passes: greedy, log-probs, stops, groups, compiles."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.config import ConfigError, build
from jaxrl_llm.models import Decoder, KVCache
from jaxrl_llm.sampler import (
    SamplingConfig,
    broadcast_cache,
    bucket_length,
    generate,
    jit_sample_tokens,
    left_pad,
    sample_tokens,
)
from losses.logprobs import completion_logits, token_logprobs
from tests.sampler.helpers import full_logits, reference_distribution, tiny_model

V = 13
PROMPTS = [[1, 2, 3, 4, 5], [6], [7, 8, 9]]


# One sampling setup shared by several tests, so they reuse one compiled program: 3 prompts of
# different lengths × G = 3 samples, T = 10 (not a multiple of steps_per_loop = 4), stop token
# 0 (rows stop early or run out of budget), a smaller budget for the first prompt.
G, T = 3, 10
BUDGETS = [4, T, T]
STANDARD = dict(
    max_new_tokens=BUDGETS,
    num_samples=G,
    stop_tokens=[0],
    pad_id=11,
    temperature=0.7,
    steps_per_loop=4,
)


@functools.cache
def model():
    return tiny_model(vocab=V, seed=0)


@functools.cache
def standard_rollout(seed: int = 1):
    return generate(model(), PROMPTS, key=jax.random.key(seed), **STANDARD)


def _standard_config() -> SamplingConfig:
    return SamplingConfig(
        max_new_tokens=T,
        num_samples=G,
        stop_tokens=(0,),
        pad_id=11,
        temperature=0.7,
        steps_per_loop=4,
    )


def _completion_logits(rollout) -> np.ndarray:
    P = rollout.prompt_mask.shape[1]
    T = rollout.completion_tokens.shape[1]
    logits = full_logits(model(), rollout.tokens, rollout.attention_mask)
    return np.asarray(completion_logits(jnp.asarray(logits), P, T))


def test_greedy_equals_an_uncached_argmax_loop():
    steps = 8
    out = generate(
        model(),
        PROMPTS,
        max_new_tokens=steps,
        key=jax.random.key(0),
        temperature=0.0,
        stop_tokens=(),
    )
    # Reference: the full forward pass over a right-padded buffer, argmax at the last real token.
    width = max(map(len, PROMPTS)) + steps
    seqs = np.zeros((len(PROMPTS), width), np.int32)
    lengths = np.array([len(p) for p in PROMPTS])
    for i, p in enumerate(PROMPTS):
        seqs[i, : len(p)] = p
    ref_lp = []
    for _ in range(steps):
        mask = np.arange(width)[None] < lengths[:, None]
        z = full_logits(model(), seqs, mask)[np.arange(len(PROMPTS)), lengths - 1].astype(
            np.float64
        )
        nxt = z.argmax(axis=1)
        ref_lp.append(
            z.max(axis=1)
            - z.max(axis=1)
            - np.log(np.exp(z - z.max(axis=1, keepdims=True)).sum(axis=1))
        )
        seqs[np.arange(len(PROMPTS)), lengths] = nxt
        lengths = lengths + 1
    for i, p in enumerate(PROMPTS):
        np.testing.assert_array_equal(
            np.asarray(out.completion_tokens[i]), seqs[i, len(p) : len(p) + steps]
        )
    np.testing.assert_allclose(
        np.asarray(out.logprobs), np.stack(ref_lp, axis=1), atol=1e-5, rtol=0
    )
    assert np.asarray(out.truncated).all() and (np.asarray(out.lengths) == steps).all()
    np.testing.assert_array_equal(np.asarray(out.sampling_logprobs), 0.0)


@pytest.mark.parametrize("filters", [False, True], ids=["temperature", "filters"])
def test_logprobs_equal_token_logprobs_of_a_fresh_forward(filters):
    setting = dict(temperature=1.2, top_k=5, top_p=0.9, min_p=0.05) if filters else {}
    if filters:
        out = generate(model(), PROMPTS, key=jax.random.key(1), **{**STANDARD, **setting})
    else:
        out, setting = standard_rollout(), dict(temperature=STANDARD["temperature"])
    mask = np.asarray(out.completion_mask)
    assert mask.shape == (9, T) and 0 < mask.sum() < mask.size  # some rows stopped early
    logits = _completion_logits(out)
    tokens = np.asarray(out.completion_tokens)
    want = np.asarray(
        token_logprobs(jnp.asarray(logits), jnp.asarray(tokens), temperature=setting["temperature"])
    )
    got = np.asarray(out.logprobs)
    np.testing.assert_allclose(got[mask], want[mask], atol=1e-5, rtol=0)
    assert (got[~mask] == 0).all() and (np.asarray(out.sampling_logprobs)[~mask] == 0).all()
    behaviour = reference_distribution(logits, **setting)
    picked = np.take_along_axis(behaviour, tokens[..., None], axis=-1)[..., 0]
    assert (picked[mask] > 0).all()  # no sampled token lies outside the filtered support
    np.testing.assert_allclose(
        np.asarray(out.sampling_logprobs)[mask], np.log(picked[mask]), atol=1e-5, rtol=0
    )


def test_first_token_frequencies_match_the_exact_filtered_distribution():
    n, setting = 4000, dict(temperature=0.9, top_p=0.9)
    out = generate(
        model(),
        [PROMPTS[0]],
        max_new_tokens=1,
        key=jax.random.key(2),
        num_samples=n,
        stop_tokens=(),
        **setting,
    )
    z = full_logits(model(), np.array(PROMPTS[:1]), np.ones((1, 5), bool))[0, -1]
    probs = reference_distribution(z, **setting)
    freq = np.bincount(np.asarray(out.completion_tokens[:, 0]), minlength=V) / n
    assert (freq[probs == 0] == 0).all()
    np.testing.assert_array_less(np.abs(freq - probs), 5 * np.sqrt(probs * (1 - probs) / n) + 1e-9)


def test_stop_tokens_budgets_masks_and_truncation():
    out = standard_rollout()
    tokens, lengths = np.asarray(out.completion_tokens), np.asarray(out.lengths)
    mask, truncated = np.asarray(out.completion_mask), np.asarray(out.truncated)
    budgets = np.repeat(BUDGETS, G)
    np.testing.assert_array_equal(mask, np.arange(T)[None] < lengths[:, None])
    for n in range(len(PROMPTS) * G):
        L, row = lengths[n], tokens[n]
        assert 1 <= L <= budgets[n]
        assert not (row[: L - 1] == 0).any()  # nothing counts after a stop token
        assert truncated[n] == (row[L - 1] != 0)
        if truncated[n]:
            assert budgets[n] == L
        assert (row[L:] == 11).all() and (np.asarray(out.logprobs)[n, L:] == 0).all()
    assert truncated.any() and (~truncated).any() and (lengths < budgets).any()
    P = out.prompt_mask.shape[1]
    np.testing.assert_array_equal(np.asarray(out.tokens[:, P:]), tokens)
    want_prompts, want_mask = left_pad(PROMPTS, length=P, pad_id=11)
    np.testing.assert_array_equal(np.asarray(out.prompt_mask), np.repeat(want_mask, G, axis=0))
    np.testing.assert_array_equal(np.asarray(out.tokens[:, :P]), np.repeat(want_prompts, G, axis=0))


def test_group_rows_equal_independent_single_prompt_runs_with_the_same_keys():
    keys = jax.random.split(jax.random.key(4), len(PROMPTS) * G)
    group = generate(model(), PROMPTS, key=keys, **STANDARD)
    P = group.prompt_mask.shape[1]
    completions = np.asarray(group.completion_tokens)
    for b, prompt in enumerate(PROMPTS):
        rows = np.asarray(group.tokens[b * G : (b + 1) * G, :P])
        assert (rows == rows[0]).all() and rows[0, P - len(prompt) :].tolist() == prompt
        assert len({tuple(c) for c in completions[b * G : (b + 1) * G]}) > 1
    graphdef, state = nnx.split(model())
    config = dataclasses.replace(_standard_config(), num_samples=1)
    for n in range(len(PROMPTS) * G):
        b = n // G
        tokens, mask = left_pad([PROMPTS[b]], length=P, pad_id=11)
        single = jit_sample_tokens(
            graphdef,
            state,
            tokens,
            mask,
            keys[n : n + 1],
            config=config,
            max_new_tokens=np.array([BUDGETS[b]], np.int32),
        )
        np.testing.assert_array_equal(np.asarray(single.completion_tokens[0]), completions[n])
        np.testing.assert_allclose(
            np.asarray(single.logprobs[0]), np.asarray(group.logprobs[n]), atol=1e-5, rtol=0
        )
    again = generate(model(), PROMPTS, key=keys, **STANDARD)
    np.testing.assert_array_equal(np.asarray(again.completion_tokens), completions)
    assert (np.asarray(standard_rollout().completion_tokens) != completions).any()


def test_padded_array_prompts_equal_list_prompts():
    tokens = np.zeros((3, 6), np.int32)
    mask = np.zeros((3, 6), bool)
    for i, p in enumerate(PROMPTS):  # right padding: generate re-pads on the left
        tokens[i, : len(p)], mask[i, : len(p)] = p, True
    a = generate(model(), tokens, prompt_mask=mask, key=jax.random.key(1), **STANDARD)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(standard_rollout().tokens))


def test_new_weights_keys_and_prompts_reuse_one_compiled_program():
    graphdef, state = nnx.split(model())
    config = _standard_config()
    tokens, mask = left_pad(PROMPTS, length=16, pad_id=0)
    first = jit_sample_tokens(graphdef, state, tokens, mask, jax.random.key(0), config=config)
    compiled = jit_sample_tokens.jitted._cache_size()
    for i in range(3):  # an "update step": new weights, new key, new prompts of the same bucket
        state = jax.tree.map(lambda x: x * 1.1, state)
        tokens, mask = left_pad([[3 + i] * (i + 2), [4], [5, 6]], length=16, pad_id=0)
        out = jit_sample_tokens(graphdef, state, tokens, mask, jax.random.key(i), config=config)
    assert jit_sample_tokens.jitted._cache_size() == compiled
    same_inputs = jit_sample_tokens(
        graphdef, state, *left_pad(PROMPTS, length=16, pad_id=0), jax.random.key(0), config=config
    )
    assert (np.asarray(same_inputs.logprobs) != np.asarray(first.logprobs)).any()  # weights used
    assert out.tokens.shape == (9, 16 + T)
    bucket_32 = left_pad([list(range(1, 13)) * 2] * 3, length=bucket_length(24), pad_id=0)
    jit_sample_tokens(graphdef, state, *bucket_32, jax.random.key(0), config=config)
    assert jit_sample_tokens.jitted._cache_size() == compiled + 1  # a new bucket compiles once


def test_core_runs_inside_an_outer_jit_and_scan():
    graphdef, state = nnx.split(model())
    config = _standard_config()
    tokens, mask = left_pad(PROMPTS, length=16, pad_id=0)
    keys = jax.random.split(jax.random.key(7), 2)

    @jax.jit
    def iterations(state, keys):
        def body(state, key):
            rollout = sample_tokens(graphdef, state, tokens, mask, key, config=config)
            return jax.tree.map(lambda x: 0.9 * x, state), rollout.completion_tokens

        return jax.lax.scan(body, state, keys)[1]

    got = np.asarray(iterations(state, keys))
    for i in range(2):
        want = jit_sample_tokens(graphdef, state, tokens, mask, keys[i], config=config)
        np.testing.assert_array_equal(got[i], np.asarray(want.completion_tokens))
        state = jax.tree.map(lambda x: 0.9 * x, state)


def test_bad_inputs_raise_clear_errors():
    m, key = model(), jax.random.key(0)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(m, [[1], []], max_new_tokens=2, key=key)
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 13\)"):
        generate(m, [[1, 13]], max_new_tokens=2, key=key)
    with pytest.raises(ValueError, match="`max_new_tokens` must be an int >= 1"):
        generate(m, [[1]], max_new_tokens=0, key=key)
    with pytest.raises(ValueError, match=r"expected 1, 2 \(one per prompt\) or 6"):
        generate(m, [[1], [2]], max_new_tokens=[1, 2, 3], key=key, num_samples=3)
    with pytest.raises(ValueError, match="`num_samples` must be an int >= 1"):
        generate(m, [[1]], max_new_tokens=2, key=key, num_samples=0)
    with pytest.raises(ValueError, match="one key or 2 per-row keys"):
        generate(m, [[1], [2]], max_new_tokens=2, key=jax.random.split(key, 3))
    with pytest.raises(ValueError, match="must be a Decoder"):
        generate(object(), [[1]], max_new_tokens=2, key=key)
    with pytest.raises(ValueError, match="`prompt_mask` must have the prompts' shape"):
        generate(
            m, np.ones((2, 3), np.int32), prompt_mask=np.ones((2, 4)), max_new_tokens=2, key=key
        )
    with pytest.raises(ValueError, match="`top_p` must be in"):
        generate(m, [[1]], max_new_tokens=2, key=key, top_p=0.0)
    # the padding id also left-pads the prompts: outside the vocabulary it would NaN the forward
    with pytest.raises(
        ValueError, match=r"`pad_id` must be a token of the model's vocabulary \[0, 13\), got 13"
    ):
        generate(m, [[1], [2, 3]], max_new_tokens=2, key=key, pad_id=13)
    with pytest.raises(
        ValueError, match=r"`stop_tokens` must be tokens of .*\[0, 13\), got \[99\]"
    ):
        generate(m, [[1]], max_new_tokens=2, key=key, stop_tokens=[2, 99])
    with pytest.raises(ValueError, match=r"`prompt_tokens` must be token ids .*encode texts"):
        generate(m, ["hello"], max_new_tokens=2, key=key)
    with pytest.raises(ValueError, match=r"`temperature` 1e-38 is below 1e-06.*use 0"):
        generate(m, [[1]], max_new_tokens=2, key=key, temperature=1e-38)
    # a mask with a hole would join the prompt's pieces and renumber their positions
    with pytest.raises(ValueError, match=r"`prompt_mask` row 0 has a hole \(\[1, 0, 1\]\)"):
        generate(m, np.array([[1, 2, 3]]), prompt_mask=np.array([[1, 0, 1]]), max_new_tokens=2,
                 key=key)  # fmt: skip
    for ids in ([[1.7, 2.2]], [["1", "2"]], [[True, 2]]):  # not silently cast to ints
        with pytest.raises(ValueError, match="`prompt_tokens` must be token ids"):
            generate(m, ids, max_new_tokens=2, key=key)
    with pytest.raises(ValueError, match=r"\[B, P\] \(rows of one length\)"):
        generate(m, [[1], [2, 3]], prompt_mask=[[1], [1, 1]], max_new_tokens=2, key=key)
    with pytest.raises(ValueError, match="`stop_tokens` must be a token id or a list of them"):
        generate(m, [[1]], max_new_tokens=2, key=key, stop_tokens=[0.5])
    one_stop = generate(m, [[1]], max_new_tokens=3, key=key, stop_tokens=np.int64(5))
    assert one_stop.tokens.shape == generate(m, [[1]], max_new_tokens=3, key=key).tokens.shape
    with pytest.raises(ValueError, match=r"`key` must be a PRNG key .* got dtype int32"):
        generate(m, [[1], [2]], max_new_tokens=2, key=np.array([0, 7], np.int32), row_groups=2)
    with pytest.warns(UserWarning, match="temperature 0 decodes greedily; top_k, top_p and min_p"):
        generate(m, [[1]], max_new_tokens=2, key=key, temperature=0.0, top_k=5)
    with pytest.warns(UserWarning, match="`tokenizer` is used only to match `stop_strings`"):
        generate(m, [[1]], max_new_tokens=2, key=key, tokenizer=object())
    with pytest.warns(UserWarning, match=r"over the model's context of 8 positions"):
        short = Decoder(dataclasses.replace(m.config, max_position_embeddings=8), rngs=nnx.Rngs(0))
        generate(short, [list(range(1, 7))], max_new_tokens=3, key=key)
    graphdef, state = nnx.split(m)
    with pytest.raises(ValueError, match=r"`prompt_tokens` must be an integer array \[B, P\]"):
        sample_tokens(
            graphdef, state, jnp.ones((3,), jnp.int32), jnp.ones((3,)), key, config=SamplingConfig()
        )
    with pytest.raises(
        ValueError, match=r"`max_new_tokens` must be None or an integer array \[1\]"
    ):
        sample_tokens(
            graphdef,
            state,
            jnp.ones((1, 2), jnp.int32),
            jnp.ones((1, 2)),
            key,
            config=SamplingConfig(),
            max_new_tokens=jnp.ones((2,), jnp.int32),
        )
    # called directly (not through generate): right padding or a hole would misplace the prompt
    tokens = jnp.ones((2, 3), jnp.int32)
    for row in ([1, 1, 0], [1, 0, 1], [0, 0, 0]):
        with pytest.raises(
            ValueError, match=r"prompt 1 is not left-padded: .*got \[" + _row_text(row)
        ):
            sample_tokens(
                graphdef, state, tokens, jnp.array([[0, 1, 1], row]), key, config=SamplingConfig()
            )
        # the jitted entry point checks a concrete mask before it traces (it sampled silently)
        with pytest.raises(ValueError, match=r"prompt 1 is not left-padded"):
            jit_sample_tokens(
                graphdef, state, tokens, np.array([[0, 1, 1], row]), key, config=SamplingConfig()
            )


def test_numpy_scalars_are_settings_like_python_numbers():
    """A setting read from an array (`np.float32(0.7)`) is its Python number: the same config,
    hence the same compiled program (they were refused with a message showing the value)."""
    numpy_cfg = SamplingConfig(temperature=np.float32(0.5), top_p=np.float32(0.5), min_p=np.float64(0.25),
                               top_k=np.int64(5), num_samples=np.int32(2), pad_id=np.int64(3),
                               stop_tokens=(np.int64(7),))  # fmt: skip
    python_cfg = SamplingConfig(temperature=0.5, top_p=0.5, min_p=0.25, top_k=5, num_samples=2,
                                pad_id=3, stop_tokens=(7,))  # fmt: skip
    assert numpy_cfg == python_cfg and hash(numpy_cfg) == hash(python_cfg)
    assert type(numpy_cfg.top_k) is int and type(numpy_cfg.temperature) is float
    m = tiny_model(vocab=13, layers=1)
    out = generate(m, [[1, 2]], max_new_tokens=2, key=jax.random.key(0), num_samples=np.int64(2))
    assert out.tokens.shape[0] == 2


def _row_text(row):
    return ", ".join(map(str, row))


def test_config_builds_from_yaml_mappings_and_rejects_bad_values():
    cfg = build(SamplingConfig, {"max_new_tokens": 8, "temperature": 0, "stop_tokens": [1, 2]})
    assert cfg.greedy and not cfg.filtered and cfg.stop_tokens == (1, 2)
    assert SamplingConfig(top_k=3).filtered and not SamplingConfig(min_p=0.0).filtered
    with pytest.raises(ConfigError, match=r"unknown key 'top_q' \(did you mean 'top_p'"):
        build(SamplingConfig, {"top_q": 0.9})
    for bad, match in [
        (dict(temperature=-1.0), "`temperature` must be a finite number >= 0"),
        (dict(top_k=0), "`top_k` must be an int >= 1"),
        (dict(min_p=1.5), "`min_p` must be in"),
        (dict(stop_tokens=(-1,)), "`stop_tokens` must be a tuple of token ids"),
        (dict(num_samples=0), "`num_samples` must be an int >= 1"),
    ]:
        with pytest.raises(ValueError, match=match):
            SamplingConfig(**bad)


def test_buckets_and_left_padding():
    assert [bucket_length(n) for n in (1, 16, 17, 100)] == [16, 16, 32, 128]
    assert bucket_length(3, minimum=1) == 4 and bucket_length(65, multiple=64) == 128
    with pytest.raises(ValueError, match="`length` must be an int >= 1"):
        bucket_length(0)
    with pytest.raises(ValueError, match=r"`multiple` must be None or an int >= 1, got 2\.5"):
        bucket_length(5, multiple=2.5)
    with pytest.raises(ValueError, match="prompt 0 has 3 tokens; every prompt needs 1 to 2"):
        left_pad([[1, 2, 3]], length=2, pad_id=0)


def test_cache_axes_name_every_buffer_axis_and_broadcast_repeats_rows():
    cfg = model().config
    cache = KVCache.init(cfg, batch=2, max_len=3, shared_length=True)
    cache = cache._replace(
        k=jax.random.normal(jax.random.key(0), cache.k.shape),
        v=jax.random.normal(jax.random.key(1), cache.v.shape),
        positions=jnp.array([[-1, 0, 1], [0, 1, 2]], jnp.int32),
        lengths=jnp.array(3, jnp.int32),
    )
    axes = cache.logical_axes()
    sizes = {"layers": 2, "batch": 2, "kv_heads": 2, "head_dim": 4, "cache_seq": 3}
    for field in ("k", "v", "positions"):
        names, shape = getattr(axes, field), getattr(cache, field).shape
        assert tuple(sizes[n] for n in names) == shape, (field, names, shape)
    assert axes.lengths == ()
    out = broadcast_cache(cache, 3, 7)
    assert out.k.shape == (2, 6, 2, 7, 4) and out.v.shape == (2, 6, 2, 4, 7)
    for n in range(6):
        np.testing.assert_array_equal(out.k[:, n, :, :3], cache.k[:, n // 3])
        np.testing.assert_array_equal(out.v[:, n, :, :, :3], cache.v[:, n // 3])
        np.testing.assert_array_equal(
            out.positions[n], [*cache.positions[n // 3].tolist(), -1, -1, -1, -1]
        )
    assert (np.asarray(out.k[:, :, :, 3:]) == 0).all() and int(out.lengths) == 3
    with pytest.raises(ValueError, match="max_len=2 < the cache's 3 slots"):
        broadcast_cache(cache, 2, 2)


def test_sliding_window_layers_decode_as_the_uncached_forward():
    """Decode steps give the positions to the sliding-window mask (the rotary angles come from
    their own table): a position off by one moves the window by one token. Gemma-2-style layers
    (sliding window 3, soft-capped logits) against the plain forward (mutation testing)."""
    from jaxrl_llm.models import RopeConfig

    local = tiny_model(
        vocab=V,
        seed=3,
        layers=3,
        sliding_window=3,
        attn_logit_softcap=2.0,
        layer_types=("sliding_attention", "full_attention", "sliding_attention"),
        local_rope=RopeConfig(theta=100.0),
    )
    out = generate(
        local,
        [[1, 2, 3, 4, 5], [6, 7]],
        max_new_tokens=6,
        temperature=0.0,
        stop_tokens=(),
        row_groups=1,
        key=jax.random.key(0),
    )
    P, steps = out.prompt_mask.shape[1], out.completion_tokens.shape[1]
    logits = completion_logits(
        jnp.asarray(full_logits(local, out.tokens, out.attention_mask)), P, steps
    )
    want = token_logprobs(logits, out.completion_tokens)
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(want), atol=1e-5, rtol=0)
    np.testing.assert_array_equal(out.completion_tokens, np.argmax(np.asarray(logits), -1))


def test_a_zero_budget_row_generates_nothing():
    """`sample_tokens`' per-row budgets clip to [0, T]: a row with budget 0 is done before the
    first step (no token, an empty mask), the other row runs its whole budget."""
    graphdef, state = nnx.split(model())
    config = SamplingConfig(max_new_tokens=3, stop_tokens=())
    prompts, mask = left_pad([[1, 2], [3]], length=2, pad_id=0)
    out = sample_tokens(
        graphdef,
        state,
        jnp.asarray(prompts),
        jnp.asarray(mask),
        jax.random.key(0),
        config=config,
        max_new_tokens=jnp.array([0, 3]),
    )
    np.testing.assert_array_equal(out.lengths, [0, 3])
    np.testing.assert_array_equal(out.completion_mask, [[0, 0, 0], [1, 1, 1]])
