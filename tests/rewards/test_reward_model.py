"""`fn: reward_model`: a Hugging Face sequence-classification reward model as a reward function.

The scores of `rewards.reward_model` (`rewards/model_reward.py`; batched, right-padded to a power-of-two length, filler
rows, truncated to the last `max_length` tokens) must equal `transformers`'
`*ForSequenceClassification` run in float64 on each text alone; a causal LM checkpoint, a
missing directory, an unknown option, dtype or mesh field and a mesh that does not fit the
devices are errors that name the problem (the multi-device meshes are checked on 8 simulated
devices in `tests/sharding/multidevice_runner.py`); and GRPO on a
random reward model raises that model's score (the policy learns what the reward model likes).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from flax import nnx

from jaxrl_llm.cli import main
from jaxrl_llm.models import Decoder, ModelConfig, ValueModel, save_pretrained
from jaxrl_llm.rewards import RewardFunctionConfig, resolve_reward_function
from jaxrl_llm.rewards.model_reward import reward_model
from jaxrl_llm.tokenizer import ByteTokenizer
from tests.runner.helpers import CONFIGS, TINY, records

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CFG = ModelConfig(
    family="qwen3",
    vocab_size=259,
    hidden_size=16,
    intermediate_size=32,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random reward model (its score head drawn like a critic's)."""
    path = tmp_path_factory.mktemp("rm")
    save_pretrained(ValueModel(CFG, rngs=nnx.Rngs(3)), path)
    return path


def _hf_scores(path, texts, max_length):
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        path, dtype=torch.float64
    ).eval()
    tok = ByteTokenizer()
    out = []
    for text in texts:
        ids = tok.encode(text, add_eos=True)[-max_length:]
        with torch.no_grad():
            out.append(float(model(torch.tensor([ids])).logits[0, 0]))
    return np.array(out)


def test_scores_equal_transformers_on_each_text_alone(checkpoint):
    prompts = ["1+1=", "12+30=", "7+8=", "", "99+99="]
    completions = ["2", "42 and more words here", "15", "x", "198" * 12]
    score = reward_model(checkpoint=str(checkpoint), tokenizer="byte", batch_size=3, max_length=24)
    ours = np.array(score(prompts, completions))
    texts = [p + c for p, c in zip(prompts, completions, strict=True)]
    reference = _hf_scores(checkpoint, texts, max_length=24)  # the last text is cut to 24
    np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-5)
    assert np.ptp(reference) > 1e-3  # the texts get different scores


def test_resolved_from_a_config_and_bad_checkpoints_are_named(checkpoint, tmp_path):
    config = RewardFunctionConfig(
        fn="reward_model", weight=0.5, kwargs={"checkpoint": str(checkpoint), "tokenizer": "byte"}
    )
    rf = resolve_reward_function(config)
    assert rf.name == "reward_model" and rf.weight == 0.5
    assert len(rf.fn(["1+1="], ["2"], answer=["2"])) == 1
    save_pretrained(Decoder(CFG, rngs=nnx.Rngs(0)), tmp_path / "lm")
    with pytest.raises(ValueError, match=r"no `score.weight`: not a \*ForSequenceClassification"):
        reward_model(checkpoint=str(tmp_path / "lm"), tokenizer="byte")
    with pytest.raises(ValueError, match="is not a checkpoint directory"):
        reward_model(checkpoint=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="unknown option 'batchsize'"):
        resolve_reward_function(
            RewardFunctionConfig(fn="reward_model", kwargs={"checkpoint": "x", "batchsize": 2})
        )
    with pytest.raises(ValueError, match="`batch_size` must be an int >= 1"):
        reward_model(checkpoint=str(checkpoint), batch_size=0)
    with pytest.raises(ValueError, match="`dtype` must be one of"):
        reward_model(checkpoint=str(checkpoint), dtype="float16")
    with pytest.raises(ValueError, match=r"`mesh` \{'data': 2\} does not fit this process's 1"):
        reward_model(checkpoint=str(checkpoint), mesh={"data": 2})
    with pytest.raises(ValueError, match="unexpected keyword argument 'model'"):
        reward_model(checkpoint=str(checkpoint), mesh={"model": 1})
    # a byte-tokenizer export has no tokenizer files: the fix is the reward model's option
    with pytest.raises(ValueError, match=r"reward_model: no tokenizer files in .* set its `tok"):
        reward_model(checkpoint=str(checkpoint))


def test_grpo_raises_the_reward_models_score(checkpoint, tmp_path):
    """30 GRPO steps on 4 fixed prompts × 8 samples: the mean score of the last 7 steps is
    above that of the first 7 by more than the steps' noise (about 0.01 per step here)."""
    # scored at the completion's last token (`add_eos: false`): a random model's score at an
    # appended EOS varies little with the text (about 0.005 here), at the text's end 10× more
    kwargs = {"checkpoint": str(checkpoint), "tokenizer": "byte", "add_eos": False}
    rm = json.dumps({"fn": "reward_model", "kwargs": kwargs})
    overrides = [
        *TINY,
        f"rewards.functions=[{rm}]",
        "data.arithmetic.train_size=4",
        "train.prompts_per_step=4",
        "sampling.num_samples=8",
        "train.steps=30",
        "train.log_every=1",
        "train.eval_prompts=0",
        "export.enabled=false",
        "optim.name=adamw",
        "optim.momentum=null",
        "optim.learning_rate=0.01",
    ]
    assert main(["train", str(CONFIGS / "grpo.yaml"), *overrides, "--run-dir", str(tmp_path)]) == 0
    scores = [r["reward/reward_model/mean"] for r in records(tmp_path) if "loss/total" in r]
    assert len(scores) == 30
    assert np.mean(scores[-7:]) - np.mean(scores[:7]) > 0.015, np.round(scores, 4).tolist()
