"""The compiled rollout sampler: jitted prefill + `lax.while_loop` decode over a KV cache.

- `generate(model, prompts, *, max_new_tokens, key, ...)`: host-side entry point (prompts of
  any lengths are left-padded to a bucketed length) returning a `Rollout`.
- `sample_tokens(graphdef, state, prompt_tokens, prompt_mask, key, config=...)`: the pure,
  jittable core, usable inside another `jax.jit` / `lax.scan`; weights are traced arguments.
- `SamplingConfig`: the static settings (budget, temperature, top-k / top-p / min-p, G samples
  per prompt, stop tokens and stop strings), a frozen dataclass built from YAML;
  `with_stop_strings(config, tokenizer)` adds the matcher of its stop strings
  (`sampler.stop_strings`).
"""

from jaxrl_llm.sampler.api import generate, jit_sample_tokens
from jaxrl_llm.sampler.buckets import bucket_length, left_pad
from jaxrl_llm.sampler.config import SamplingConfig, with_stop_strings
from jaxrl_llm.sampler.core import broadcast_cache, sample_tokens
from jaxrl_llm.sampler.filters import Draw, draw_tokens, filter_logits, row_uniforms
from jaxrl_llm.sampler.rollout import Rollout

__all__ = [
    "Draw",
    "Rollout",
    "SamplingConfig",
    "broadcast_cache",
    "bucket_length",
    "draw_tokens",
    "filter_logits",
    "generate",
    "jit_sample_tokens",
    "left_pad",
    "row_uniforms",
    "sample_tokens",
    "with_stop_strings",
]
