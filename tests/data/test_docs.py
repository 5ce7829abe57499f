"""The YAML examples of docs/rewards_and_data.md load as configs."""

from __future__ import annotations

import pathlib
import re

import yaml

from jaxrl_llm.config import build
from jaxrl_llm.data import DataConfig
from jaxrl_llm.rewards import RewardConfig

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "rewards_and_data.md"
SECTIONS = {"data": DataConfig, "rewards": RewardConfig}


def test_doc_yaml_examples_build():
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    built = []
    for block in blocks:
        for section, data in yaml.safe_load(block).items():
            built.append(build(SECTIONS[section], data, path=section))
    assert {type(c) for c in built} == set(SECTIONS.values())
    assert len(built) == len(blocks) == 4
