"""`losses`: pure, jittable, shardable loss functions for RL on language models.

Every function takes arrays plus keyword-only hyperparameters, works under `jax.jit`, `jax.grad`
and on sharded inputs, and imports nothing heavier than jax (no flax, optax, orbax, transformers).
Formulas, defaults and the peer libraries' conventions are documented per function and in
ALGORITHMS.md. Shape letters: `B` prompts, `G` samples per prompt, `N = B·G` sequences, `T`
completion length, `V` vocabulary, `K` reward components.
"""

from losses.aggregation import AGG_MODES, aggregate
from losses.layout import broadcast_to_tokens, from_groups, to_groups
from losses.masked import masked_count, masked_mean, masked_sum, masked_var, masked_whiten
from losses.ppo import ppo_clip_loss, reinforce_loss

__all__ = [
    "AGG_MODES",
    "aggregate",
    "broadcast_to_tokens",
    "from_groups",
    "masked_count",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "ppo_clip_loss",
    "reinforce_loss",
    "to_groups",
]
