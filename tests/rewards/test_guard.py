"""`score_rewards`: every failure kind under every policy, reported with its example."""

from __future__ import annotations

import logging
import math
import threading

import numpy as np
import pytest

from jaxrl_llm.rewards import (
    RewardFunction,
    RewardFunctionError,
    call_with_timeout,
    merge_reward_metrics,
    reward_metric_names,
    score_rewards,
)

G = 2
PROMPTS = ["1+1=", "1+1=", "2+3=", "2+3=", "4+4=", "4+4="]
COMPLETIONS = ["2", "3", "5", "boom", "8", "8"]
FIELDS = {"answer": ["2", "2", "5", "5", "8", "8"]}
N = len(COMPLETIONS)


def correct(prompts, completions, *, answer, **_):
    return [float(c == a) for c, a in zip(completions, answer, strict=True)]


def raises_on_boom(prompts, completions, *, answer, **_):
    if "boom" in completions:
        raise ZeroDivisionError("cannot score 'boom'")
    return [1.0] * len(completions)


def none_on_boom(prompts, completions, **_):
    return [None if c == "boom" else 0.5 for c in completions]


def nan_on_boom(prompts, completions, **_):
    return [math.nan if c == "boom" else 0.5 for c in completions]


def inf_on_three(prompts, completions, **_):
    return np.array([-np.inf if c == "3" else 0.25 for c in completions], np.float32)


def text_on_boom(prompts, completions, **_):
    return ["high" if c == "boom" else 1 for c in completions]


def one_short(prompts, completions, **_):
    return [1.0] * (len(completions) - 1)


def scalar(prompts, completions, **_):
    return 1.0


def matrix(prompts, completions, **_):
    return np.ones((len(completions), 2))


def batch_only(prompts, completions, **_):
    if len(completions) > 1:
        raise MemoryError("batch too large")
    return [1.0]


_release = threading.Event()


def hangs(prompts, completions, **_):
    _release.wait(5.0)
    return [0.0] * len(completions)


def unordered(prompts, completions, **_):  # a set has no row order
    return set(range(len(completions)))


def huge_on_three(prompts, completions, **_):  # finite in float64, inf once stored as float32
    return [1e39 if c == "3" else 0.0 for c in completions]


def int_too_big_on_three(prompts, completions, **_):  # float() of it raises OverflowError
    return [10**400 if c == "3" else 0 for c in completions]


def rf(fn, name=None):
    return RewardFunction(name or fn.__name__, fn, 1.0)


def run(fns, policy, **kw):
    return score_rewards(
        [rf(f) for f in fns], PROMPTS, COMPLETIONS, FIELDS, group_size=G, on_failure=policy, **kw
    )


def test_clean_batch_scores_every_function():
    out = run([correct], "fail")
    np.testing.assert_array_equal(out.rewards[:, 0], [1, 0, 1, 0, 1, 1])
    assert out.rewards.dtype == np.float32 and out.valid.all() and out.failures == ()
    assert out.metrics["reward/correct/mean"] == pytest.approx(4 / 6)
    assert all(out.metrics[f"reward/failures/{k}"] == 0 for k in ("raised", "none", "timeout"))


@pytest.mark.parametrize(
    ("fn", "kind", "rows"),
    [
        (raises_on_boom, "raised", [3]),
        (none_on_boom, "none", [3]),
        (nan_on_boom, "nonfinite", [3]),
        (inf_on_three, "nonfinite", [1]),
        (huge_on_three, "nonfinite", [1]),
        (int_too_big_on_three, "nonfinite", [1]),
        (text_on_boom, "wrong_type", [3]),
        (one_short, "wrong_length", list(range(N))),
        (scalar, "wrong_type", list(range(N))),
        (unordered, "wrong_type", list(range(N))),
        (matrix, "wrong_length", list(range(N))),
        (batch_only, "raised", list(range(N))),
    ],
)
def test_score_policy_replaces_exactly_the_failed_entries(fn, kind, rows):
    out = run([correct, fn], "score", failure_score=-3.0)
    failed = np.zeros(N, bool)
    failed[rows] = True
    assert {f.kind for f in out.failures} == {kind}
    np.testing.assert_array_equal(out.rewards[failed, 1], -3.0)
    assert np.all(out.rewards[~failed, 1] != -3.0)
    np.testing.assert_array_equal(out.rewards[:, 0], [1, 0, 1, 0, 1, 1])  # others untouched
    assert np.isfinite(out.rewards).all() and out.valid.all()
    assert out.metrics[f"reward/{fn.__name__}/failures"] == len(rows)
    assert out.metrics[f"reward/failures/{kind}"] == len(out.failures) >= 1
    assert out.metrics["reward/correct/failures"] == 0
    np.testing.assert_array_equal(out.failed, np.stack([np.zeros(N, bool), failed], axis=1))


@pytest.mark.parametrize(
    ("fn", "dropped_groups"),
    [(raises_on_boom, [1]), (nan_on_boom, [1]), (inf_on_three, [0]), (one_short, [0, 1, 2])],
)
def test_drop_group_invalidates_whole_groups(fn, dropped_groups):
    out = run([correct, fn], "drop_group", failure_score=0.0)
    expected_valid = np.ones((N // G, G), bool)
    expected_valid[dropped_groups] = False
    np.testing.assert_array_equal(out.valid, expected_valid.reshape(-1))
    assert out.metrics["reward/dropped_groups"] == len(dropped_groups)
    assert np.isfinite(out.rewards).all()


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (raises_on_boom, "raised ZeroDivisionError: cannot score 'boom' on row 3 of 6"),
        (none_on_boom, "returned None on row 3 of 6"),
        (nan_on_boom, "returned nan on row 3 of 6"),
        (inf_on_three, "returned -inf on row 1 of 6"),
        (text_on_boom, "returned str 'high', not a number on row 3 of 6"),
        (one_short, "returned 5 values for 6 completions on all 6 rows; first example"),
        (scalar, "returned float 1.0, not a sequence of 6 numbers"),
        (matrix, "returned an array of shape (6, 2), expected (6,)"),
        (batch_only, "raised MemoryError: batch too large on the batch, but on no row alone"),
    ],
)
def test_fail_policy_names_function_failure_and_example(fn, expected):
    with pytest.raises(RewardFunctionError) as err:
        run([correct, fn], "fail")
    message = str(err.value)
    assert f"reward function {fn.__name__!r}" in message
    assert expected in message
    row = 1 if fn is inf_on_three else (3 if "row 3" in expected else 0)
    assert f"prompt:     {PROMPTS[row]!r}" in message
    assert f"completion: {COMPLETIONS[row]!r}" in message
    assert f"fields:     {{'answer': {FIELDS['answer'][row]!r}}}" in message
    assert "on_failure='fail'" in message


def test_array_outputs_and_array_scalars_are_accepted():
    import jax.numpy as jnp

    def jax_array(prompts, completions, **_):
        return jnp.ones(len(completions))

    def list_of_scalars(prompts, completions, **_):
        return [
            jnp.float32(0.5),
            np.float64(0.25),
            True,
            2,
            *[np.array(1.0)] * (len(completions) - 4),
        ]

    out = run([jax_array, list_of_scalars], "fail")
    np.testing.assert_array_equal(out.rewards[:, 0], 1.0)
    np.testing.assert_array_equal(out.rewards[:, 1], [0.5, 0.25, 1.0, 2.0, 1.0, 1.0])


def test_isolation_can_be_turned_off():
    out = run([raises_on_boom], "score", isolate=False, failure_score=-1.0)
    np.testing.assert_array_equal(out.rewards[:, 0], -1.0)  # the whole call failed
    assert [(f.kind, f.row) for f in out.failures] == [("raised", None)]


def test_timeout_fails_the_call_and_reports_it():
    _release.clear()
    try:
        out = run([correct, hangs], "score", timeout_s=0.05, failure_score=-2.0)
        np.testing.assert_array_equal(out.rewards[:, 1], -2.0)
        np.testing.assert_array_equal(out.rewards[:, 0], [1, 0, 1, 0, 1, 1])
        assert out.metrics["reward/failures/timeout"] == 1
        with pytest.raises(RewardFunctionError, match=r"'hangs' took over 0\.05 s on all 6 rows"):
            run([hangs], "fail", timeout_s=0.05)
    finally:
        _release.set()  # let the abandoned threads finish


def own_timeout(prompts, completions, **_):
    raise TimeoutError("upstream service timed out")


def test_a_timeout_error_raised_by_the_function_is_not_our_timeout():
    out = run([own_timeout], "score", timeout_s=5.0)
    assert {f.kind for f in out.failures} == {"raised"}
    assert "TimeoutError: upstream service timed out" in out.failures[0].detail


@pytest.mark.parametrize("timeout_s", [5.0, None])
def test_example_fields_named_like_the_timeout_helpers_arguments_reach_the_function(timeout_s):
    """Fields `fn` and `timeout_s` (e.g. from a JSONL data set): every call once failed with
    "got multiple values for argument 'fn'" or a KeyError, blamed on the reward function."""
    fields = {**FIELDS, "fn": ["x"] * N, "timeout_s": ["y"] * N}
    out = score_rewards(
        [rf(correct)], PROMPTS, COMPLETIONS, fields, group_size=G, on_failure="fail",
        timeout_s=timeout_s,
    )  # fmt: skip
    np.testing.assert_array_equal(out.rewards[:, 0], [1, 0, 1, 0, 1, 1])


def test_call_with_timeout_reraises_the_function_error():
    with pytest.raises(KeyError, match="k"):
        call_with_timeout(lambda: {}["k"], timeout_s=1.0)
    assert call_with_timeout(max, 1, 5, timeout_s=None) == 5


def test_failures_are_logged_not_silent(caplog):
    with caplog.at_level(logging.WARNING, logger="jaxrl_llm.rewards.guard"):
        run([nan_on_boom], "score")
    assert "'nan_on_boom' returned nan on row 3 of 6" in caplog.text
    assert "1 failure(s)" in caplog.text


@pytest.mark.parametrize("policy", ["score", "drop_group"])
@pytest.mark.parametrize("cut", [1, 2])  # groups [0, cut) and [cut, 3)
def test_parts_scored_apart_merge_into_the_whole_batch(policy, cut):
    fns = [rf(correct), rf(none_on_boom), rf(inf_on_three)]
    whole = score_rewards(fns, PROMPTS, COMPLETIONS, FIELDS, group_size=G, on_failure=policy)
    parts = [
        score_rewards(
            fns,
            PROMPTS[rows],
            COMPLETIONS[rows],
            {k: v[rows] for k, v in FIELDS.items()},
            group_size=G,
            on_failure=policy,
        )
        for rows in (slice(0, cut * G), slice(cut * G, N))
    ]
    assert list(whole.metrics) == reward_metric_names([f.name for f in fns])
    merged = merge_reward_metrics([p.metrics for p in parts], [cut * G, N - cut * G])
    assert merged.keys() == whole.metrics.keys()
    for key, value in whole.metrics.items():
        assert merged[key] == pytest.approx(value, rel=1e-6), key
    assert merged["reward/none_on_boom/mean"] == 0.5 and merged["reward/correct/mean"] > 0
    np.testing.assert_array_equal(np.concatenate([p.rewards for p in parts]), whole.rewards)
    np.testing.assert_array_equal(np.concatenate([p.valid for p in parts]), whole.valid)


def test_merge_reward_metrics_refuses_parts_that_do_not_fit():
    with pytest.raises(ValueError, match="one row count per part"):
        merge_reward_metrics([{"reward/dropped_groups": 0.0}], [1, 2])
    with pytest.raises(ValueError, match="part 1 has the keys"):
        merge_reward_metrics([{"a": 1.0}, {"b": 1.0}], [1, 1])


def test_mean_metric_counts_only_successful_rows():
    out = run([nan_on_boom], "score", failure_score=-100.0)
    assert out.metrics["reward/nan_on_boom/mean"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"on_failure": "skip"}, "`on_failure` must be one of"),
        ({"group_size": 4}, "`group_size` must be a positive divisor of the 6 completions, got 4"),
        ({"group_size": 0}, "`group_size` must be a positive divisor"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    args = {"group_size": G, **kwargs}
    with pytest.raises(ValueError, match=message):
        score_rewards([rf(correct)], PROMPTS, COMPLETIONS, FIELDS, **args)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="5 prompts for 6 completions"):
        score_rewards([rf(correct)], PROMPTS[:5], COMPLETIONS, FIELDS)
    with pytest.raises(ValueError, match="field 'answer' must hold one value per completion"):
        score_rewards([rf(correct)], PROMPTS, COMPLETIONS, {"answer": ["2"]})
    with pytest.raises(ValueError, match="`functions` is empty"):
        score_rewards([], PROMPTS, COMPLETIONS, FIELDS)


def test_stop_ids_and_group_sizes_may_be_numpy_or_jax_integers():
    import jax.numpy as jnp

    from jaxrl_llm.rewards import decode_completions
    from jaxrl_llm.tokenizer import ByteTokenizer

    out = score_rewards([rf(correct)], PROMPTS, COMPLETIONS, FIELDS, group_size=np.int64(G))
    np.testing.assert_array_equal(out.rewards[:, 0], [1, 0, 1, 0, 1, 1])
    tokens, mask = np.array([[49, 10, 50, 258]]), np.ones((1, 4), bool)
    for stops in (jnp.int32(10), jnp.array([10, 258]), np.array([10])):
        assert decode_completions(ByteTokenizer(), tokens, mask, stop_ids=stops) == ["1"]
    for bad in (True, [], [1.5], [[10]]):
        with pytest.raises(ValueError, match="`stop_ids` must be an int or a non-empty sequence"):
            decode_completions(ByteTokenizer(), tokens, mask, stop_ids=bad)
