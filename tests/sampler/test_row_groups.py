"""Row groups: a sampling call split by prompts and run from host threads gives the same rollout."""

from __future__ import annotations

import functools
import threading

import jax
import numpy as np
import pytest

from jaxrl_llm.sampler import generate, row_groups
from jaxrl_llm.sampler.row_groups import (
    MAX_AUTO_GROUPS,
    MIN_GROUP_FLOPS,
    auto_row_groups,
    call_flops,
    call_in_row_groups,
    map_in_threads,
    resolve_row_groups,
    split_row_keys,
)
from tests.sampler.helpers import tiny_model

PROMPTS = [[1, 2, 3, 4, 5], [6], [7, 8, 9], [10, 11], [2], [3, 3, 3]]
SETTING = dict(
    max_new_tokens=[3, 9, 9, 5, 9, 9],  # per-prompt budgets, some below T
    num_samples=2,  # the prompt cache is broadcast to each group's rows
    stop_tokens=[0],  # rows stop early
    pad_id=12,
    temperature=0.8,
    top_k=6,
)


@functools.cache
def model():
    return tiny_model(vocab=13, seed=3)


@pytest.mark.parametrize("groups", [2, 3, 6])
@pytest.mark.parametrize("per_row_keys", [False, True], ids=["one_key", "row_keys"])
def test_groups_give_the_rollout_of_one_call(groups, per_row_keys):
    key = jax.random.key(7)
    if per_row_keys:
        key = jax.random.split(key, len(PROMPTS) * 2)
    one = generate(model(), PROMPTS, key=key, row_groups=1, **SETTING)
    split = generate(model(), PROMPTS, key=key, row_groups=groups, **SETTING)
    for name in ("tokens", "completion_mask", "lengths", "truncated", "prompt_mask"):
        np.testing.assert_array_equal(
            np.asarray(getattr(split, name)), np.asarray(getattr(one, name)), err_msg=name
        )
    for name in ("logprobs", "sampling_logprobs"):  # other batch sizes may round differently
        np.testing.assert_allclose(
            np.asarray(getattr(split, name)), np.asarray(getattr(one, name)), atol=1e-5, rtol=0
        )
    lengths = np.asarray(one.lengths)
    assert (lengths < 9).any() and (lengths == 9).any()  # stops and full budgets both occur
    assert split.tokens.shape == one.tokens.shape and split.tokens.sharding == one.tokens.sharding


def test_groups_run_on_their_own_threads_inside_the_callers_mesh():
    mesh = jax.make_mesh((1,), ("data",))
    seen, barrier = {}, threading.Barrier(3, timeout=30)

    def call(j):
        barrier.wait()  # all three calls are in flight at once: they cannot run one by one
        seen[j] = (threading.get_ident(), jax.sharding.get_mesh())
        return {"rows": jax.numpy.full((2,), j)}

    with jax.set_mesh(mesh):
        out = call_in_row_groups(call, 3)
    assert out["rows"].tolist() == [0, 0, 1, 1, 2, 2]
    assert len({ident for ident, _ in seen.values()}) == 3
    assert all(m == mesh for _, m in seen.values())
    assert call_in_row_groups(lambda j: {"j": j}, 1) == {"j": 0}  # one group: called in place


def test_an_error_in_a_group_reaches_the_caller():
    def call(j):
        if j == 1:
            raise RuntimeError("group 1 failed")
        return jax.numpy.zeros((1,))

    with pytest.raises(RuntimeError, match="group 1 failed"):
        call_in_row_groups(call, 2)


def test_a_group_that_runs_in_row_groups_itself_finishes():
    """`generate(row_groups=2)` called from a group of another row-group call: the inner
    groups run on the group's thread (waiting for the busy pool hung forever)."""
    m = tiny_model(vocab=13, layers=1)

    def sample(j):
        return generate(m, [[1, 2], [3]], max_new_tokens=3, key=jax.random.key(j), row_groups=2)

    outer = map_in_threads(sample, 2)
    for j, out in enumerate(outer):
        np.testing.assert_array_equal(out.tokens, sample(j).tokens)


def test_row_keys_are_the_keys_of_one_call():
    key = jax.random.key(3)
    parts = split_row_keys(key, 6, 3)
    joined = np.concatenate([np.asarray(jax.random.key_data(p)) for p in parts])
    np.testing.assert_array_equal(joined, np.asarray(jax.random.key_data(jax.random.split(key, 6))))
    raw = split_row_keys(jax.random.key_data(key), 6, 2)  # raw uint32 key data works too
    np.testing.assert_array_equal(
        np.concatenate([np.asarray(jax.random.key_data(p)) for p in raw]), joined
    )
    with pytest.raises(ValueError, match="one key or 6 per-row keys"):
        split_row_keys(jax.random.split(key, 4), 6, 2)


def test_automatic_groups_follow_the_backend_cores_and_prompts(monkeypatch):
    monkeypatch.setattr(row_groups, "cpu_cores", lambda: 4)
    assert auto_row_groups(8, backend="cpu") == 4
    assert auto_row_groups(6, backend="cpu") == 3  # the largest divisor up to the cores
    assert auto_row_groups(5, backend="cpu") == 1
    assert auto_row_groups(8, backend="gpu") == 1 and auto_row_groups(8, backend="tpu") == 1
    assert auto_row_groups(8, backend="cpu", devices=2) == 1  # a mesh splits the rows already
    # each group keeps MIN_GROUP_FLOPS of work: 2.5 groups' worth -> 2 groups, too little -> 1
    assert auto_row_groups(8, backend="cpu", flops=2.5 * MIN_GROUP_FLOPS) == 2
    assert auto_row_groups(8, backend="cpu", flops=0.5 * MIN_GROUP_FLOPS) == 1
    assert resolve_row_groups(None, 8, flops=0.5 * MIN_GROUP_FLOPS) == 1
    assert resolve_row_groups(4, 8, flops=0.5 * MIN_GROUP_FLOPS) == 4  # explicit: as asked
    monkeypatch.setattr(row_groups, "cpu_cores", lambda: 64)
    assert auto_row_groups(64, backend="cpu") == MAX_AUTO_GROUPS
    assert resolve_row_groups(None, 12, devices=1) == auto_row_groups(12)


def test_call_flops_counts_every_parameter():
    params = {"w": np.ones((4, 5)), "layers": [np.ones(3), np.ones((2, 2))], "n": None}
    assert call_flops(params, rows=6, tokens=7) == 2 * 6 * 7 * (20 + 3 + 4)


@pytest.mark.parametrize(
    ("value", "prompts", "devices", "message"),
    [
        (0, 4, 1, "must be None or an int >= 1, got 0"),
        (True, 4, 1, "must be None or an int >= 1, got True"),
        (3, 4, 1, "3 groups do not divide the 4 prompts of the call evenly"),
        (2, 4, 2, "2 groups need a call on one device; this call spans 2 devices"),
    ],
)
def test_bad_row_groups_are_refused(value, prompts, devices, message):
    with pytest.raises(ValueError, match=message):
        resolve_row_groups(value, prompts, devices=devices)


def test_generate_refuses_groups_that_do_not_divide_the_prompts():
    with pytest.raises(ValueError, match="4 groups do not divide the 6 prompts"):
        generate(model(), PROMPTS, key=jax.random.key(0), row_groups=4, **SETTING)
