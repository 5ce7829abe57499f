"""jaxrl_llm: the training stack (models, sampler, rewards, update step, loop, CLI) over `losses`.

Subpackages: `models` (Flax NNX decoders with Hugging Face import / export), `sampler` (the
compiled rollout sampler), `rewards`, `data`, `train` (optax update step, algorithms, SFT and
preference objectives), `runner` (the training loop behind `jaxrl-llm train`), `checkpoint`,
`metrics_log`, `plan` (memory / time estimates), `demo` (`make demo`).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
