"""The YAML → frozen-dataclass loader: every bad key or value fails at load with its path."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pytest

from jaxrl_llm.config import ConfigError, build, load_yaml


@dataclasses.dataclass(frozen=True, kw_only=True)
class Inner:
    size: int
    scale: float = 1.0

    def __post_init__(self):
        if self.scale < 0:
            raise ValueError(f"Inner: `scale` must be >= 0, got {self.scale}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outer:
    name: str = "x"
    mode: Literal["a", "b"] = "a"
    flag: bool = False
    limit: float | None = None
    inner: Inner = dataclasses.field(default_factory=lambda: Inner(size=1))
    items: tuple[Inner, ...] = ()


def test_builds_nested_values_and_converts_ints_to_floats():
    cfg = build(
        Outer,
        {"mode": "b", "limit": 3, "inner": {"size": 4}, "items": [{"size": 1, "scale": 2}]},
    )
    assert cfg == Outer(mode="b", limit=3.0, inner=Inner(size=4), items=(Inner(size=1, scale=2.0),))
    assert isinstance(cfg.limit, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.name = "y"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"nam": "y"}, "unknown key 'nam' (did you mean 'name'?)"),
        ({"mode": "c"}, "mode: must be one of 'a', 'b', got 'c'"),
        ({"flag": "yes"}, "flag: expected true or false, got 'yes'"),
        ({"limit": "big"}, "limit: expected a number, got 'big'"),
        ({"inner": {"size": 2.5}}, "inner.size: expected an integer, got 2.5"),
        ({"inner": {"sise": 2}}, "inner: unknown key 'sise' (did you mean 'size'?)"),
        ({"items": {"size": 1}}, "items: expected a list"),
        ({"items": [{"size": True}]}, "items[0].size: expected an integer, got True"),
        ({"inner": {}}, "inner: missing required key(s) 'size'."),
        # a nested dataclass's own check, prefixed with its key path
        ({"inner": {"size": 1, "scale": -1}}, "inner: Inner: `scale` must be >= 0, got -1.0."),
        ({"items": [{"size": 1}, {"size": 1, "scale": -2}]}, "items[1]: Inner: `scale` must"),
    ],
)
def test_bad_values_fail_with_the_key_path(data, message):
    with pytest.raises(ConfigError) as info:
        build(Outer, data)
    assert message in str(info.value)


def test_the_top_level_dataclass_check_is_a_config_error_too():
    """The root's own `__post_init__` check: a ConfigError with its message as it is (it was a
    plain ValueError, unlike the nested ones)."""
    with pytest.raises(ConfigError) as info:
        build(Inner, {"size": 1, "scale": -1})
    assert str(info.value) == "Inner: `scale` must be >= 0, got -1.0."


def test_load_yaml_errors(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_yaml(tmp_path / "missing.yaml")
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_yaml(path)
    broken = tmp_path / "broken.yaml"
    broken.write_text("model:\n  init: {family: qwen3\ntrain: [\n")
    with pytest.raises(
        ConfigError, match=r"broken.yaml: line 3, column 6: not valid YAML \(expected"
    ):
        load_yaml(broken)
    tab = tmp_path / "tab.yaml"
    tab.write_text("train:\n\tsteps: 3\n")
    with pytest.raises(ConfigError, match=r"tab.yaml: line 2, column 1: not valid YAML \(found"):
        load_yaml(tab)
    twice = tmp_path / "twice.yaml"  # PyYAML alone keeps the last `train:` and drops the first
    twice.write_text("train: {steps: 50}\nseed: 1\ntrain: {eval_prompts: 0}\n")
    with pytest.raises(
        ConfigError, match=r"twice.yaml: line 3, column 1: not valid YAML \(duplicate key 'train'"
    ):
        load_yaml(twice)


def test_yaml_anchors_merge_keys_and_unreadable_files(tmp_path):
    """Merge keys were refused as invalid YAML; an alias was one object shared by every place
    that named it, so an override of one changed them all; a file in another encoding raised
    a UnicodeDecodeError without the file's name."""
    path = tmp_path / "anchors.yaml"
    path.write_text(
        "lora: &l {rank: 8, alpha: 16}\ncritic: *l\nbase: &b {lr: 1, steps: 3}\n"
        "run: {<<: *b, steps: 5}\n"
    )
    data = load_yaml(path)
    assert data["run"] == {"lr": 1, "steps": 5}  # the mapping's own key wins
    data["lora"]["rank"] = 2
    assert data["critic"] == {"rank": 8, "alpha": 16}
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin.yaml: cannot read the config file"):
        load_yaml(latin)


def test_exponent_notation_is_a_number_in_files_as_in_overrides(tmp_path):
    """YAML 1.1 reads `1e-3` (no dot) as a string; a config reads it as the number it means,
    in a file and inside an override's flow mapping alike."""
    from jaxrl_llm.runner.overrides import parse_override

    path = tmp_path / "lr.yaml"
    path.write_text("optim: {learning_rate: 1e-3, b2: 9.99E-1}\nname: 1e3x\nsteps: 1_0\n")
    assert load_yaml(path) == {
        "optim": {"learning_rate": 0.001, "b2": 0.999},
        "name": "1e3x",
        "steps": 10,
    }
    assert parse_override("warm_start={steps: 5, learning_rate: 1e-3}") == (
        ("warm_start",),
        {"steps": 5, "learning_rate": 0.001},
    )


def test_a_value_that_fits_no_member_of_a_union_names_the_key_once():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Stops:
        eos: int | tuple[int, ...] | None = None

    with pytest.raises(ConfigError) as info:
        build(Stops, {"eos": "abc"}, path="model")
    assert str(info.value) == (
        "model.eos: expected an integer, got 'abc'; or expected a list, got str."
    )
