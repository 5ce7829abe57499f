"""Rewards: text verifiers, reward functions by name or import path, failure handling, combination.

Host side (Python, on decoded text):

- `verifiers`: answer extraction (`\\boxed{}`, GSM8K `####`, `<answer>` tags, last number),
  exact rational comparison, format checks.
- `builtin`: reward functions `(prompts, completions, **example_fields) -> list[float]`:
  `math_answer`, `exact_match`, `exact_answer`, `tag_format`, `regex_format`, `overlong`.
- `registry`: `RewardFunctionConfig` → `RewardFunction` (a built-in name or `module:function`).
- `guard`: `score_rewards` runs the functions with a per-call timeout and a failure policy
  (`fail` / `score` / `drop_group`), returning `rewards[N, K]`, `valid[N]` and metrics;
  `merge_reward_metrics` joins the metrics of parts of a batch scored separately.
- `decode`: `decode_completions` turns sampler output into the text the functions see.
- `score`: `score_completions`, the training loop's one call: decode, attach the example
  fields (+ `completion_lengths`), `score_rewards` with the config's policy.
- `model_reward`: `reward_model(checkpoint=...)`, a Hugging Face sequence-classification
  reward model as a reward function (`fn: reward_model`).

Device side (`jnp`, inside `jax.jit`):

- `jax_rewards`: `exact_answer_reward` for the built-in tasks, from completion tokens + mask.
- `combine`: `[N, K]` rewards → advantages, as a weighted sum or decoupled (GDPO).
"""

from jaxrl_llm.rewards.builtin import (
    BUILTIN_REWARDS,
    exact_answer,
    exact_match,
    math_answer,
    overlong,
    regex_format,
    tag_format,
)
from jaxrl_llm.rewards.combine import combined_advantages, total_reward
from jaxrl_llm.rewards.config import RewardConfig
from jaxrl_llm.rewards.decode import decode_completions
from jaxrl_llm.rewards.guard import (
    CallTimeoutError,
    RewardFailure,
    RewardFunctionError,
    RewardScores,
    call_with_timeout,
    describe_failure,
    merge_reward_metrics,
    reward_metric_names,
    score_rewards,
)
from jaxrl_llm.rewards.jax_rewards import completion_content, exact_answer_reward
from jaxrl_llm.rewards.model_reward import reward_model
from jaxrl_llm.rewards.registry import (
    RewardFunction,
    RewardFunctionConfig,
    check_reward_call,
    import_callable,
    resolve_reward_function,
)
from jaxrl_llm.rewards.score import score_completions
from jaxrl_llm.rewards.verifiers import (
    answers_match,
    extract_answer,
    extract_boxed,
    extract_hash_answer,
    extract_last_number,
    extract_tag,
    follows_tag_format,
    normalize_text,
    parse_number,
)

__all__ = [
    "BUILTIN_REWARDS",
    "CallTimeoutError",
    "RewardConfig",
    "RewardFailure",
    "RewardFunction",
    "RewardFunctionConfig",
    "RewardFunctionError",
    "RewardScores",
    "answers_match",
    "call_with_timeout",
    "check_reward_call",
    "combined_advantages",
    "completion_content",
    "decode_completions",
    "describe_failure",
    "exact_answer",
    "exact_answer_reward",
    "exact_match",
    "extract_answer",
    "extract_boxed",
    "extract_hash_answer",
    "extract_last_number",
    "extract_tag",
    "follows_tag_format",
    "import_callable",
    "math_answer",
    "merge_reward_metrics",
    "normalize_text",
    "overlong",
    "parse_number",
    "regex_format",
    "resolve_reward_function",
    "reward_metric_names",
    "reward_model",
    "score_completions",
    "score_rewards",
    "tag_format",
    "total_reward",
]
