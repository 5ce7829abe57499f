"""jaxrl_llm: the training stack (models, sampler, rewards, update step, loop, CLI) over `losses`.

This release ships the config loader and the `demo` command; the stack grows issue by issue.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
