"""A reward function that hangs, in a real run: the per-call timeout fires and the configured
`rewards.on_failure` applies; every outcome names the function and shows an offending example.

Reward functions that raise, return None, NaN or the wrong length are covered row by row in
`tests/rewards/test_guard.py` and in a run in `tests/runner/test_rewards_in_loop.py`; this file
adds the hang, which only a real (threaded) call with a timeout can show.
"""

from __future__ import annotations

import numpy as np

from tests.reliability.helpers import BASE, train
from tests.runner.helpers import records

HANG = [
    *BASE,
    "rewards.functions=[{fn: 'tests.reliability.helpers:hanging_reward'}]",
    "rewards.timeout_s=0.2",
]
EXAMPLE = "reward function 'hanging_reward' took over 0.2 s on all 4 rows; first example"


def _steps(run_dir):
    return [r for r in records(run_dir) if "loss/total" in r]


def test_hang_with_on_failure_fail_stops_the_run_with_the_example(tmp_path, capsys):
    assert train(tmp_path / "run", [*HANG, "rewards.on_failure=fail"]) == 1
    err = capsys.readouterr().err
    assert f"jaxrl-llm train: {EXAMPLE}" in err, err
    assert "  prompt:     '" in err and "  completion: '" in err and "fields:" in err
    assert "on_failure='fail'; set it to 'score' or 'drop_group'" in err
    assert "Traceback" not in err
    assert _steps(tmp_path / "run") == []  # stopped in step 1, before its update


def test_hang_with_on_failure_score_trains_on_the_failure_score(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="jaxrl_llm"):
        code = train(
            tmp_path / "run", [*HANG, "rewards.on_failure=score", "rewards.failure_score=-1.0"]
        )
    assert code == 0
    steps = _steps(tmp_path / "run")
    assert [r["reward/failures/timeout"] for r in steps] == [1.0, 1.0]
    assert [r["reward/mean"] for r in steps] == [-1.0, -1.0]  # every row got the failure score
    assert all(r["reward/valid_frac"] == 1.0 for r in steps)
    assert all(np.isfinite(v) for r in steps for v in r.values() if isinstance(v, float))
    assert caplog.text.count(EXAMPLE) == 2  # reported with its example, once per step
    assert "on_failure='score'" in caplog.text


def test_hang_with_on_failure_drop_group_drops_every_group_without_nan(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="jaxrl_llm"):
        assert train(tmp_path / "run", [*HANG, "rewards.on_failure=drop_group"]) == 0
    steps = _steps(tmp_path / "run")
    assert [r["reward/dropped_groups"] for r in steps] == [2.0, 2.0]
    assert [r["reward/valid_frac"] for r in steps] == [0.0, 0.0]
    assert all(np.isfinite(v) for r in steps for v in r.values() if isinstance(v, float))
    assert all(r["optim/grad_norm"] == 0.0 for r in steps)  # no token is left in the loss
    assert EXAMPLE in caplog.text
    assert "every group was dropped by reward-function failures" in caplog.text
