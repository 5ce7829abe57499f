"""`train.pack_groups`: the RL loop's forwards and update on each step's groups packed without
padding (`jaxrl_llm.runner.packed_groups`), with the padded steps' metrics and parameters.

The run is `test_trim_completions`'s (32 completion slots, three quarters of the byte ids
stop a row, so completions of uneven lengths, cut to 4-16 slots), two steps with and without
packing, for GRPO (a KL loss: the reference forward packed too), Dr. GRPO, GSPO (sequence-level
ratios), DAPO with refills (two epochs: the old-policy forward packed too), PPO with a
`ValueModel` critic or a value head (the critic's forward packed too), and updates of several
shuffled minibatches and accumulation steps of whole groups; and the runs it refuses.
"""

from __future__ import annotations

import pytest

from jaxrl_llm.config import ConfigError
from jaxrl_llm.runner import load_run_config
from tests.extended import extended
from tests.runner.helpers import CONFIGS
from tests.runner.test_trim_completions import RUN, _steps, assert_same_steps


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("grpo", ()),
        ("grpo", ("sampling.row_groups=2",)),  # updates and forwards in row groups, packed in parts
        extended("dr_grpo", ()),
        extended("gspo", ()),
        extended("dapo", ("train.max_refills=1", "algorithm.epochs=2")),
        ("ppo", ()),  # a ValueModel critic, 4 epochs: old-policy and value forwards packed
        extended(
            "ppo_value_head_adaptive_kl",
            ("algorithm.minibatches=1", "optim.accumulation_steps=1"),
        ),
        # 2 epochs × 2 shuffled minibatches × 2 accumulation steps of whole groups: one
        # packing per epoch, each micro-batch's groups in its own rows
        ("ppo_value_head_adaptive_kl", ("algorithm.minibatch_unit=prompt",)),
        extended("grpo", ("algorithm.minibatches=2", "algorithm.minibatch_unit=prompt")),
        # online DPO's best and worst of 4 samples: the kept pairs packed after the choice,
        # for the reference forward and the update, in one call and in 2 row groups
        extended("online_dpo", ("sampling.num_samples=4",)),
        ("online_dpo", ("sampling.num_samples=4", "sampling.row_groups=2")),
        ("online_dpo", ("sampling.num_samples=4", "algorithm.minibatches=2")),
    ],
)
def test_packed_steps_match_the_padded_steps(tmp_path, name, overrides):
    history, perf, params = _steps(
        tmp_path / "packed", name, True, "train.pack_groups=true", *overrides
    )
    packed = [p for p in perf if "perf/packed_rows" in p]
    assert packed  # a step ran packed
    row_groups = 2 if "sampling.row_groups=2" in overrides else 1
    assert all(p["perf/packed_row_groups"] == row_groups for p in packed)
    history_padded, _, params_padded = _steps(tmp_path / "padded", name, True, *overrides)
    assert_same_steps((history, params), (history_padded, params_padded), name)


def _first_step(run_dir, *overrides):
    from jaxrl_llm.runner import loop, prepare_run

    config = load_run_config(
        str(CONFIGS / "grpo.yaml"), [*RUN, "train.pack_groups=true", *overrides], run_dir=run_dir
    )
    prepared = prepare_run(config)
    prepared.checkpointer.close()
    _, _, metrics = loop._rl_step(prepared.context, prepared.state, prepared.data, 1)
    return metrics


def test_a_batch_packing_saves_little_of_stays_padded(tmp_path):
    metrics = _first_step(tmp_path, "train.pack_min_saving=0.99")
    assert "perf/packed_rows" not in metrics and metrics["perf/completion_width"] < 32


def test_the_saving_counts_the_rows_packing_removes():
    """`packed_slot_saving` weighs the packed rows, not the padding: completions longer than
    half the width pack one to a row and save nothing, however much padding they leave."""
    import numpy as np

    from jaxrl_llm.runner import packed_slot_saving
    from jaxrl_llm.train import SequenceBatch, pack_groups

    P, T, G = 2, 8, 2
    lengths = [[5, 5], [8, 1], [2, 3], [6, 7]]  # group 0: 2 rows; 1: 2; 2: 1; 3: 2
    N = G * len(lengths)
    tokens = np.ones((N, P + T), np.int32)
    attention = np.zeros((N, P + T), np.int32)
    attention[:, :P] = 1
    for n, c in enumerate(np.ravel(lengths)):
        attention[n, P : P + c] = 1
    batch = SequenceBatch(tokens, attention, attention[:, P:].astype(np.float32))
    rows = pack_groups(batch, G, row_step=1).tokens.shape[0]
    assert rows == 7
    slots = len(lengths) * P + N * T
    saving = packed_slot_saving(batch, G)
    # the default row step rounds to multiples of ⌈N / 8⌉ = 1 row: the same 7 rows
    np.testing.assert_allclose(saving, 1 - (len(lengths) * P + rows * T) / slots)
    full = attention.copy()
    full[:, P:] = attention[:1, P:]  # every completion as long as the first (5 of 8 slots)
    one_per_row = SequenceBatch(tokens, full, full[:, P:].astype(np.float32))
    assert packed_slot_saving(one_per_row, G) == 0.0  # 33 % padding, no row saved


def test_packing_is_logged(tmp_path):
    metrics = _first_step(tmp_path)
    assert metrics["perf/completion_width"] < 32 and 0 < metrics["perf/packing_fill"] <= 1
    # completion rows of W slots: the short completions of a group share rows
    assert 4 <= metrics["perf/packed_rows"] < 8  # at least a row per group, fewer than N


@pytest.mark.parametrize(
    ("config", "overrides", "why"),
    [
        ("grpo", ("algorithm.minibatches=2",), "take strided rows.*minibatch_unit: prompt"),
        ("grpo", ("optim.accumulation_steps=2",), "take strided rows"),
        ("grpo", ("train.compiled_iterations=2", "rewards={jax_native: true}",
                  "checkpoint.every=2"), "the compiled iteration"),
        ("grpo", ("parallel=pmap",), "parallel: pmap"),
        ("sft", (), "a sft run has none"),
    ],
)  # fmt: skip
def test_runs_it_cannot_pack_are_refused(tmp_path, config, overrides, why):
    with pytest.raises(ConfigError, match=f"train.pack_groups: .*{why}"):
        load_run_config(
            str(CONFIGS / f"{config}.yaml"),
            [*RUN, "train.pack_groups=true", *overrides],
            run_dir=tmp_path,
        )
