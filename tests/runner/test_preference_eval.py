"""Held-out preference evaluation (`runner.preference.evaluate_preference`) against a float64
reference computed with `transformers` on each sequence alone.

A DPO run (`configs/dpo.yaml`, generated arithmetic pairs) scores the held-out pairs at step 0
and at its end. At step 0 the policy is the reference, so every implicit reward is 0: the loss
is log 2, the margin 0 and no pair is ranked right. At the end, the exported policy and the
initial one (the reference) are loaded into torch in float64; each held-out sequence
(prompt + completion, no padding) gives its completion's log-probability sum, and
−log σ(β((π_c − ref_c) − (π_r − ref_r))) and the fraction of pairs with a positive margin,
averaged over the pairs, must equal the logged metrics (float32 tolerance).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.cli import main
from jaxrl_llm.models import Decoder, save_pretrained
from jaxrl_llm.runner import load_preference_eval_examples, load_run_config
from jaxrl_llm.tokenizer import ByteTokenizer
from tests.runner.helpers import CONFIGS, PREFERENCE, records

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

DPO = str(CONFIGS / "dpo.yaml")
RUN = [*PREFERENCE, "train.steps=3", "train.eval_prompts=4", "optim.learning_rate=0.05"]
BETA = 0.1  # configs/dpo.yaml


def _completion_logp(model, prompt, completion) -> float:
    """Σ log p(completion tokens | prefix) of one unpadded sequence, in float64."""
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = model(ids).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    start = len(prompt)
    return float(sum(logp[t - 1, ids[0, t]] for t in range(start, ids.shape[1])))


def test_dpo_eval_metrics_match_a_float64_reference(tmp_path):
    run_dir = tmp_path / "run"
    assert main(["train", DPO, *RUN, "--run-dir", str(run_dir)]) == 0
    evals = [r for r in records(run_dir) if "eval/pref/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 3]
    start, end = evals
    assert start["eval/preference_examples"] == 4.0  # 4 held-out pairs: 2 batches of 2
    assert start["eval/loss/preference"] == pytest.approx(math.log(2.0), rel=1e-6)
    assert start["eval/pref/margin"] == 0.0 and start["eval/pref/accuracy"] == 0.0

    config = load_run_config(DPO, RUN, run_dir=run_dir)
    initial = tmp_path / "initial"
    save_pretrained(Decoder(config.model.init, rngs=nnx.Rngs(config.seed)), initial)
    load = transformers.AutoModelForCausalLM.from_pretrained
    policy = load(run_dir / "export", dtype=torch.float64).eval()
    reference = load(initial, dtype=torch.float64).eval()
    losses, right = [], []
    for example in load_preference_eval_examples(config, ByteTokenizer()):
        margin = 0.0
        for completion, sign in ((example.chosen, 1.0), (example.rejected, -1.0)):
            pi = _completion_logp(policy, example.prompt, completion)
            ref = _completion_logp(reference, example.prompt, completion)
            margin += sign * BETA * (pi - ref)
        losses.append(-math.log(1.0 / (1.0 + math.exp(-margin))))
        right.append(margin > 0)
    assert len(losses) == 4 and np.std(losses) > 0  # the pairs differ after training
    assert end["eval/loss/preference"] == pytest.approx(np.mean(losses), rel=1e-4)
    assert end["eval/pref/accuracy"] == np.mean(right)


def test_held_out_pairs_from_a_jsonl_file_and_kto_examples(tmp_path):
    pairs = tmp_path / "held_out.jsonl"
    pairs.write_text(
        '{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n'
        '{"prompt": "2+2=", "chosen": "4", "rejected": "5"}\n'
        '{"prompt": "3+3=", "chosen": "6", "rejected": "7"}\n'  # a third: not a whole batch
    )
    one = [*PREFERENCE, "train.steps=1", f"data.preference_eval_source=jsonl:{pairs}"]
    assert main(["train", DPO, *one, "--run-dir", str(tmp_path / "dpo")]) == 0
    start, end = [r for r in records(tmp_path / "dpo") if "eval/pref/accuracy" in r]
    assert start["eval/preference_examples"] == 2.0
    assert start["eval/loss/preference"] == pytest.approx(math.log(2.0), rel=1e-6)
    # `jaxrl-llm eval` on the last checkpoint scores the same examples as the run's last eval
    assert main(["eval", DPO, *one, "--run-dir", str(tmp_path / "dpo")]) == 0
    result = json.loads((tmp_path / "dpo" / "eval" / "step_1.json").read_text())
    assert {k: v for k, v in result.items() if k.startswith("eval/pref")} == {
        k: v for k, v in end.items() if k.startswith("eval/pref")
    }

    kto = [*PREFERENCE, "train.steps=1"]  # unpaired held-out examples from the arithmetic task
    assert main(["train", str(CONFIGS / "kto.yaml"), *kto, "--run-dir", str(tmp_path / "kto")]) == 0
    start = next(r for r in records(tmp_path / "kto") if "eval/pref/accuracy" in r)
    assert start["eval/preference_examples"] == 2.0 and np.isfinite(start["eval/loss/preference"])


def test_bco_evaluation_uses_the_shift_training_reached(tmp_path):
    """After 2 BCO steps the held-out batches are scored with δ = the state's running mean (the
    `pref/delta` metric), and evaluating twice gives the same metrics: the moments do not move."""
    from jaxrl_llm.runner import evaluate_preference, loop, prepare_run

    config = load_run_config(
        str(CONFIGS / "bco.yaml"), [*PREFERENCE, "train.eval_prompts=4"], run_dir=tmp_path
    )
    prepared = prepare_run(config)
    prepared.checkpointer.close()
    ctx, state, data = prepared.context, prepared.state, prepared.data
    for step in (1, 2):
        state, data, _ = loop._preference_step(ctx, state, data, step)
    delta = float(state.reward_moments.mean)
    assert delta != 0.0
    first, second = evaluate_preference(ctx, state), evaluate_preference(ctx, state)
    assert first["eval/pref/delta"] == pytest.approx(delta, abs=1e-7)
    timing = {"time/preference_eval_s"}
    assert {k: v for k, v in first.items() if k not in timing} == {
        k: v for k, v in second.items() if k not in timing
    }
    assert float(state.reward_moments.mean) == delta


def test_fewer_held_out_examples_than_a_batch_are_named(caplog):
    """`train.eval_prompts` below `train.prompts_per_step` leaves no whole batch to score: the
    run says so instead of evaluating nothing silently."""
    config = load_run_config(
        DPO, [*PREFERENCE, "train.prompts_per_step=4", "train.eval_prompts=3"], run_dir="/r"
    )
    assert load_preference_eval_examples(config, ByteTokenizer()) == []
    assert "3 held-out examples (train.eval_prompts = 3) are fewer than one batch" in caplog.text
