"""docs/checkpoints_and_metrics.md: its YAML builds, and its loop resumes exactly after a crash."""

from __future__ import annotations

import pathlib
import re

import yaml

from jaxrl_llm.checkpoint import CheckpointConfig, Checkpointer
from jaxrl_llm.config import build
from jaxrl_llm.data import IteratorState
from jaxrl_llm.metrics_log import MetricsConfig, MetricsLogger, plot_curves, read_metrics
from tests.checkpoint.helpers import assert_bitwise_equal, make_state, train_step

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "checkpoints_and_metrics.md"
SECTIONS = {"checkpoint": CheckpointConfig, "metrics": MetricsConfig}
STEPS = 6


def test_doc_yaml_examples_build():
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    built = [build(SECTIONS[k], v, path=k) for b in blocks for k, v in yaml.safe_load(b).items()]
    assert [type(c) for c in built] == [CheckpointConfig, MetricsConfig]
    assert built[0] == CheckpointConfig(every=50, keep=3, async_save=True)


def _run(run_dir: pathlib.Path, *, resume: bool, stop_after: int | None = None):
    """The loop of the doc; `stop_after` simulates a crash (no final save, files left open)."""
    cfg = CheckpointConfig(every=2, keep=2)
    ckpt = Checkpointer.from_config(run_dir / "checkpoints", cfg)
    state = make_state(7)  # the restore target (values are overwritten on resume)
    data = IteratorState(seed=0, epoch=0, position=0)
    start = 0
    if resume and ckpt.latest_step() is not None:
        state, meta = ckpt.restore(target_state=state)
        data = IteratorState.from_dict(meta["data"])
        start = meta["step"]
    log = MetricsLogger.from_config(
        run_dir,
        MetricsConfig(console=False),
        total_steps=STEPS,
        resume_step=start if resume else None,
    )
    for step in range(start + 1, STEPS + 1):
        state = train_step(state)
        data = data._replace(position=data.position + 4)
        log.log(step, {"reward/mean": float(state.step) / 10, "kl/mean": 0.01 * step})
        ckpt.maybe_save(step, state, {"step": step, "data": data._asdict()})
        if step == stop_after:
            ckpt.wait()  # let the last periodic save land, then "crash"
            return state, data
    ckpt.save(STEPS, state, {"step": STEPS, "data": data._asdict()})
    ckpt.close()
    log.close()
    plot_curves(run_dir / "metrics.jsonl", run_dir / "curves.png")
    return state, data


def test_doc_loop_resumes_bit_for_bit_without_duplicate_metrics(tmp_path):
    straight, straight_data = _run(tmp_path / "straight", resume=False)
    run = tmp_path / "crashed"
    _run(run, resume=False, stop_after=5)  # checkpoints at 2 and 4; step 5 logged, not saved
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4, 5]
    resumed, resumed_data = _run(run, resume=True)
    assert_bitwise_equal(resumed, straight)
    assert resumed_data == straight_data == IteratorState(0, 0, 4 * STEPS)
    records = read_metrics(run)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]  # step 5 not duplicated
    reference = read_metrics(tmp_path / "straight")
    assert [r["reward/mean"] for r in records] == [r["reward/mean"] for r in reference]
    assert (run / "curves.png").read_bytes()[:4] == b"\x89PNG"
    with Checkpointer(run / "checkpoints", save_every=2) as ckpt:
        assert ckpt.all_steps() == [4, 6]  # keep=2
