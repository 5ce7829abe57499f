"""TRL (`trl`, CPU build of torch) GRPO on the benchmark's model and workload.

    python -m benchmarks.peers.trl_grpo '{"model": "tiny", "prompts": 2, ...}' STEPS

Run in the peers' environment. The setup a TRL user writes: a randomly initialised
`transformers.Qwen3ForCausalLM` of the workload's shape (float32), saved to a directory
whose path goes to the trainer (TRL loads the policy and, because β > 0, the frozen reference
from it), `GRPOTrainer` with `GRPOConfig(num_generations=G,
per_device_train_batch_size=B·G, max_completion_length=T, beta=0.04, epsilon=0.2,
learning_rate=1e-3, max_grad_norm=1, num_iterations=1, temperature=1, top_p=1, top_k=0,
gradient_checkpointing=False)` (TRL's default recomputes the forward in the backward, which
neither ours nor Tunix does), AdamW (TRL's default optimizer) with a constant learning rate and
no warm-up, `use_cpu`,
a byte tokenizer (`ByT5Tokenizer`, 259 ids: the same vocabulary size, its own id layout;
without the EOS it appends to every text, which TRL's prompts would otherwise end with),
prompts left-padded by the trainer to `PROMPT_LEN` = 16 ids as ours and Tunix's
(`pad_to_multiple_of`: TRL pads only to the batch's longest prompt on a CPU, 7 ids here, which
would time it on less work than the FLOP count credits), generation stops at EOS, and the
exact-answer reward on the decoded text.

Every optimizer step is one GRPO iteration (generation → reward → advantages → reference
log-probs → update; `steps_per_generation = 1`). A `TrainerCallback` records the time at each
step's end; seconds per step is the median of the steps after the first, time to first step
the wall time from the start of model construction to the end of the first step. torch uses
all cores (`torch.get_num_threads()` is recorded).
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import statistics
import sys
import tempfile
import time

from benchmarks.workloads import (
    BETA,
    EPSILON,
    LEARNING_RATE,
    MAX_GRAD_NORM,
    PROMPT_LEN,
    Workload,
    arithmetic_prompts,
    emit,
    exact_answer,
    load_average,
)


def check_installed() -> None:
    """Raise ImportError when TRL (and torch) are not importable here."""
    import torch  # noqa: F401
    import trl  # noqa: F401


def _model(w: Workload, seed: int):
    import torch
    import transformers

    s = w.shape
    torch.manual_seed(seed)
    config = transformers.Qwen3Config(
        vocab_size=s.vocab_size,
        hidden_size=s.hidden_size,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_layers,
        num_attention_heads=s.num_heads,
        num_key_value_heads=s.num_kv_heads,
        head_dim=s.head_dim,
        tie_word_embeddings=s.tie_embeddings,
        max_position_embeddings=4096,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    return transformers.Qwen3ForCausalLM(config)


def _prompt_tokenizer():
    """`ByT5Tokenizer` (left padding) that appends no EOS: a prompt is its bytes alone, as ours."""
    import transformers

    class PromptTokenizer(transformers.ByT5Tokenizer):
        def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
            return token_ids_0 + (token_ids_1 or [])

    tokenizer = PromptTokenizer(extra_ids=0)
    tokenizer.padding_side = "left"
    return tokenizer


def run(w: Workload, steps: int) -> dict:
    import datasets
    import torch
    import transformers
    import trl

    started = time.perf_counter()
    model_dir = tempfile.mkdtemp(prefix="trl_bench_model_")
    _model(w, seed=0).save_pretrained(model_dir)  # TRL loads the policy and the reference
    tokenizer = _prompt_tokenizer()
    N = w.prompts * w.samples
    pairs = arithmetic_prompts(w.prompts * (steps + 2), seed=0)
    longest = max(len(tokenizer(p)["input_ids"]) for p, _ in pairs)
    if longest > PROMPT_LEN:  # TRL pads to a multiple of PROMPT_LEN: one width, as ours
        raise RuntimeError(f"a prompt of {longest} ids is over PROMPT_LEN = {PROMPT_LEN}")
    dataset = datasets.Dataset.from_dict(
        {"prompt": [p for p, _ in pairs], "answer": [a for _, a in pairs]}
    )

    def reward(prompts, completions, answer, **kwargs):
        return [exact_answer(c, a) for c, a in zip(completions, answer, strict=True)]

    times: list[float] = []

    class StepTimes(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter())

    out_dir = tempfile.mkdtemp(prefix="trl_bench_")
    config = trl.GRPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=N,
        num_generations=w.samples,
        max_completion_length=w.new_tokens,
        beta=BETA,
        epsilon=EPSILON,
        num_iterations=1,
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        gradient_checkpointing=False,  # TRL's default (True) recomputes the forward; ours does not
        max_grad_norm=MAX_GRAD_NORM,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_steps=steps,
        gradient_accumulation_steps=1,
        logging_steps=10**6,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
        pad_to_multiple_of=PROMPT_LEN,
    )
    trainer = trl.GRPOTrainer(
        model=model_dir,
        reward_funcs=[reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepTimes()],
    )
    trainer.train()
    if len(times) < 2:
        raise RuntimeError(f"trl ran {len(times)} steps, expected {steps}")
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return {
        "impl": "trl",
        "workload": w.__dict__,
        "seconds_per_step": round(statistics.median(gaps), 5),
        "step_times": [round(g, 5) for g in gaps],
        "time_to_first_step_s": round(times[0] - started, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "load_avg_1min": load_average(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "trl": trl.__version__,
    }


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    workload = Workload(**json.loads(sys.argv[1]))
    emit(run(workload, int(sys.argv[2])))
