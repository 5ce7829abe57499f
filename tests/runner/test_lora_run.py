"""`model.lora` in a run: GRPO (configs/grpo.yaml), after a supervised warm start of the
adapters, trains only the adapters of a tiny random policy (with DoRA: plain LoRA's `A`, `B`
plus the magnitudes `m`, so the run covers both; tests/models checks the formulas). The base
weights stay bit for bit those of the initial model, the reference policy is the warm-started
one (KL 0 at step 1, positive once the adapters moved), and the export is the merged model
(`m / ‖W + s·A·B‖ ⊙ (W + s·A·B)` of the final adapters), a plain checkpoint, with the adapters
alone in PEFT's format, from which a new run starts (`model.lora_adapter`). PPO with
`model.critic_lora` trains only the adapters and the value head of its separate critic."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.cli import main
from jaxrl_llm.config import ConfigError
from jaxrl_llm.models import from_pretrained, merge_lora
from jaxrl_llm.runner import load_run_config, prepare_run
from tests.runner.helpers import CONFIGS, TINY, train_records

GRPO = str(CONFIGS / "grpo.yaml")
RUN = [
    *TINY,
    "model.lora={rank: 2, alpha: 4, use_dora: true}",
    "train.steps=3",
    "checkpoint.every=3",
]
RUN += ["optim.learning_rate=0.5"]
# a warm start (SFT of the adapters) first: its donated train state holds the frozen base, which
# the run keeps using afterwards
RUN += ["warm_start={steps: 2, learning_rate: 0.01, batch_size: 2}"]


def _flat(tree):
    return {".".join(map(str, path)): np.asarray(v[...]) for path, v in nnx.to_flat_state(tree)}


def test_grpo_trains_the_adapters_of_a_frozen_base_and_exports_the_merged_model(tmp_path):
    assert main(["train", GRPO, *RUN, "--run-dir", str(tmp_path)]) == 0
    steps = train_records(tmp_path)
    assert steps[0]["kl/mean"] == pytest.approx(0.0, abs=1e-9)  # the reference: the start
    assert steps[-1]["kl/mean"] > 1e-7

    config = load_run_config(GRPO, RUN, run_dir=str(tmp_path))
    prepared = prepare_run(config, resume=True)
    prepared.checkpointer.close()
    state = prepared.state
    trained = _flat(state.params["policy"])
    assert trained and all(n.endswith(("_lora_a", "_lora_b", "_lora_m")) for n in trained)
    assert any(n.endswith("_lora_m") for n in trained), sorted(trained)
    assert any(np.abs(v).max() > 0 for n, v in trained.items() if n.endswith("_lora_b"))

    # the next run starts from the exported adapters (PEFT format) on the same initial base
    adapter = ["model.lora=null", f"model.lora_adapter={tmp_path / 'export' / 'adapter'}"]
    adapter += ["warm_start=null"]
    again = prepare_run(load_run_config(GRPO, [*RUN, *adapter], run_dir=str(tmp_path / "next")))
    again.checkpointer.close()
    restarted = _flat(again.state.params["policy"])
    assert sorted(restarted) == sorted(trained)
    for name, value in trained.items():
        np.testing.assert_array_equal(restarted[name], value, err_msg=name)
    initial = _flat(again.state.frozen["policy"])  # the runner's initial base model
    frozen = _flat(state.frozen["policy"])
    assert sorted(frozen) == sorted(initial)
    for name, value in frozen.items():  # the base did not move
        np.testing.assert_array_equal(value, initial[name], err_msg=name)

    graphs = prepared.context.graphs
    final = merge_lora(nnx.merge(graphs.policy, state.params["policy"], state.frozen["policy"]))
    exported = _flat(nnx.state(from_pretrained(tmp_path / "export")))
    merged = _flat(nnx.state(final))
    assert sorted(exported) == sorted(merged)
    for name, value in merged.items():
        np.testing.assert_allclose(exported[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
    assert not np.array_equal(exported["layers.attn.q"], initial["layers.attn.q"])


PPO = str(CONFIGS / "ppo.yaml")
CRITIC_LORA = [*TINY, "model.critic_lora={rank: 2, alpha: 4}", "checkpoint.every=2"]


def test_ppo_trains_the_adapters_and_the_head_of_a_frozen_critic(tmp_path):
    """`model.critic_lora`: the separate critic's adapters and value head train, its backbone
    stays the initial model's; the policy (no `model.lora`) trains whole."""
    assert main(["train", PPO, *CRITIC_LORA, "--run-dir", str(tmp_path)]) == 0
    assert all(np.isfinite(r["loss/value"]) for r in train_records(tmp_path))
    config = load_run_config(PPO, CRITIC_LORA, run_dir=str(tmp_path))
    fresh = load_run_config(PPO, CRITIC_LORA, run_dir=str(tmp_path / "fresh"))
    initial = prepare_run(fresh)  # the same seed: the models at step 0
    initial.checkpointer.close()
    prepared = prepare_run(config, resume=True)
    prepared.checkpointer.close()
    trained, start = _flat(prepared.state.params["value"]), _flat(initial.state.params["value"])
    assert sorted(trained) == sorted(start)
    assert all(n.endswith(("_lora_a", "_lora_b")) or n.startswith("head.") for n in trained)
    assert "head.kernel" in trained and any(n.endswith("_lora_b") for n in trained)
    for name in ("head.kernel", "backbone.layers.mlp.down_lora_b"):
        assert not np.array_equal(trained[name], start[name]), name  # they moved
    frozen, base = _flat(prepared.state.frozen["value"]), _flat(initial.state.frozen["value"])
    assert "backbone.layers.attn.q" in frozen and sorted(frozen) == sorted(base)
    for name, value in frozen.items():
        np.testing.assert_array_equal(value, base[name], err_msg=name)
    assert "layers.attn.q" in _flat(prepared.state.params["policy"])  # the policy trains whole


@pytest.mark.parametrize(
    "config, override",
    [(GRPO, "model.critic_lora={rank: 2}"), (PPO, "algorithm.critic.kind=head")],
)
def test_critic_lora_needs_a_separate_critic(config, override):
    overrides = [*TINY, override]
    if config == PPO:
        overrides.append("model.critic_lora={rank: 2}")
    with pytest.raises(ConfigError, match=r"model\.critic_lora: only a separate critic"):
        load_run_config(config, overrides, run_dir="/r")
