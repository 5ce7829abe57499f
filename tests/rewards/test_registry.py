"""Reward functions by name or import path; `RewardConfig` validation at load time."""

from __future__ import annotations

import pytest

from jaxrl_llm.config import ConfigError, build
from jaxrl_llm.rewards import (
    BUILTIN_REWARDS,
    RewardConfig,
    RewardFunction,
    RewardFunctionConfig,
    check_reward_call,
    import_callable,
    resolve_reward_function,
)

NOT_CALLABLE = 3


def length_reward(prompts, completions, *, scale=1.0, **fields):
    """A user reward function, imported by path in the tests."""
    return [scale * len(c) for c in completions]


def test_every_builtin_resolves_and_has_the_reward_signature():
    for name in BUILTIN_REWARDS:
        rf = resolve_reward_function(RewardFunctionConfig(fn=name))
        assert rf.name == name and rf.fn is BUILTIN_REWARDS[name]


def test_import_path_binds_kwargs_and_names_it():
    cfg = RewardFunctionConfig(fn=f"{__name__}:length_reward", weight=0.5, kwargs={"scale": 2.0})
    rf = resolve_reward_function(cfg)
    assert rf.name == "length_reward" and rf.weight == 0.5
    assert rf.fn(["p", "p"], ["ab", "abcd"]) == [4.0, 8.0]
    named = resolve_reward_function(
        RewardFunctionConfig(fn=f"{__name__}:length_reward", name="len")
    )
    assert named.name == "len"


def test_dotted_attributes_resolve():
    assert import_callable("os:path.join")("a", "b") == "a/b"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "math_anser",
            "unknown built-in reward function 'math_anser' (did you mean 'math_answer'?)",
        ),
        ("no_such_thing", "built-ins: math_answer, exact_match"),
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        (
            f"{__name__}:length_rewrd",
            "has no attribute 'length_rewrd' (did you mean 'length_reward'?)",
        ),
        (f"{__name__}:NOT_CALLABLE", "int 3 is not callable"),
        ("a:b:c", "expected a built-in name"),
        (":f", "expected a built-in name"),
    ],
)
def test_bad_function_specs_are_explained(spec, message):
    with pytest.raises(ValueError) as err:
        resolve_reward_function(RewardFunctionConfig(fn=spec))
    assert message in str(err.value)


def test_unknown_options_are_rejected_with_a_suggestion():
    with pytest.raises(
        ValueError, match=r"unknown option 'answer_feild' \(did you mean 'answer_field'\?\)"
    ):
        resolve_reward_function(
            RewardFunctionConfig(fn="math_answer", kwargs={"answer_feild": "a"})
        )
    with pytest.raises(ValueError, match="unknown option 'scal'"):
        resolve_reward_function(
            RewardFunctionConfig(fn=f"{__name__}:length_reward", kwargs={"scal": 1})
        )


@pytest.mark.parametrize(
    ("fn", "kwargs", "message"),
    [
        ("overlong", {"max_length": 10, "buffer_length": 0}, "`buffer_length` must be > 0.0"),
        ("overlong", {"max_length": 10, "buffer_length": 20}, "must be <= `max_length` (10)"),
        ("regex_format", {"pattern": 5}, "regex_format: `pattern` must be a string, got 5."),
        ("regex_format", {"pattern": "("}, "is not a valid regex"),
        ("tag_format", {"tags": "answer"}, "got the string 'answer' (write [answer])"),
        ("math_answer", {"extract": "box"}, "math_answer: `extract` must be one of"),
        ("exact_match", {"extract": "x"}, "exact_match: `extract` must be one of"),
        # YAML's "false" in quotes is a string, which is true
        ("exact_match", {"ignore_case": "false"}, "`ignore_case` must be true or false"),
        ("math_answer", {"answer_field": 5}, "`answer_field` must be a non-empty field name"),
    ],
)
def test_bad_option_values_of_builtins_fail_when_resolved(fn, kwargs, message):
    """Not at every call, where each batch's scoring failed and the run went on with failure
    scores."""
    with pytest.raises(ValueError) as err:
        resolve_reward_function(RewardFunctionConfig(fn=fn, kwargs=kwargs))
    assert message in str(err.value)


def test_reward_config_builds_from_yaml_shaped_data():
    cfg = build(
        RewardConfig,
        {
            "functions": [
                {"fn": "math_answer", "kwargs": {"answer_field": "short_answer"}},
                {"fn": "tag_format", "weight": 0.1},
            ],
            "combine": "decoupled",
            "on_failure": "drop_group",
            "timeout_s": 5,
        },
    )
    assert cfg.weights() == (1.0, 0.1)
    assert cfg.timeout_s == 5.0 and cfg.on_failure == "drop_group"
    fns = cfg.resolve()
    assert fns[0].fn(["q"], ["#### 3"], short_answer=["3"]) == [1.0]
    assert build(RewardConfig, {}).functions == (RewardFunctionConfig(fn="exact_answer"),)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"functions": []}, "configure at least one reward function"),
        ({"on_failure": "ignore"}, "on_failure: must be one of 'fail', 'score', 'drop_group'"),
        ({"combine": "gdpo"}, "combine: must be one of 'sum', 'decoupled'"),
        ({"timeout_s": 0}, "timeout_s: must be > 0 or null"),
        ({"functions": [{"fn": "exact_answer"}, {"fn": "exact_answer"}]}, "names must be unique"),
        ({"functions": [{"fn": "math_answer"}], "jax_native": True}, "reproduces only the single"),
        ({"functions": [{"fn": "x", "kwarg": {}}]}, "unknown key 'kwarg' (did you mean 'kwargs'?)"),
        ({"functions": [{"fn": "x", "kwargs": ["a"]}]}, "`kwargs` must be a mapping"),
        ({"fucntions": []}, "unknown key 'fucntions' (did you mean 'functions'?)"),
    ],
)
def test_reward_config_errors_name_the_key(data, message):
    with pytest.raises(ConfigError) as err:
        build(RewardConfig, data)
    assert message in str(err.value)


def test_jax_native_is_allowed_for_the_exact_answer_reward():
    assert build(RewardConfig, {"jax_native": True}).jax_native


def test_a_reward_is_checked_against_the_call_the_run_makes():
    """`fn(prompts, completions, **fields)` with every example field: a function that names
    only some fields and has no `**fields` fails on the others, by name, before any scoring."""

    def named(prompts, completions, answer):
        return [0.0] * len(completions)

    def catch_all(prompts, completions, **fields):
        return [0.0] * len(completions)

    check_reward_call(RewardFunction("catch_all", catch_all, 1.0), ["answer", "id"])
    check_reward_call(RewardFunction("named", named, 1.0), ["answer"])
    with pytest.raises(ValueError, match="got an unexpected keyword argument 'id'"):
        check_reward_call(RewardFunction("named", named, 1.0), ["answer", "id"])
    bound = resolve_reward_function(RewardFunctionConfig(fn="math_answer"))
    check_reward_call(bound, ["answer", "completion_lengths"])  # built-ins take **fields
    # a misspelt answer field failed every row at scoring time, not before the model is built
    misspelt = RewardFunctionConfig(fn="math_answer", kwargs={"answer_field": "solution"})
    with pytest.raises(ValueError, match="`answer_field` = 'solution' is not a field of the data"):
        check_reward_call(resolve_reward_function(misspelt), ["answer", "completion_lengths"])
    check_reward_call(resolve_reward_function(misspelt), ["solution", "completion_lengths"])
