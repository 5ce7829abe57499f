"""Session-wide compiled functions for the update-step tests.

Compiling an update step of even a tiny transformer costs seconds on CPU, so every test that
trains a preset reuses one compiled step per preset (keyed by name) and one compiled log-prob /
value forward; the states they are called with come from freshly built models of the same
architecture (same graph, hence the same compiled program).
"""

from __future__ import annotations

import pytest

from jaxrl_llm.train import (
    OptimConfig,
    kl_controller,
    make_logprob_fn,
    make_optimizer,
    make_update_step,
    make_value_fn,
    preset,
    rl_objective,
    split_models,
)
from tests.train.helpers import UPDATE_LAYERS, tiny_critic, tiny_policy

# one optimizer for every preset test (large enough for the learning tests)
OPTIM = OptimConfig(name="adamw", learning_rate=3e-3, max_grad_norm=1.0, weight_decay=0.0)


class Compiled:
    """Lazily built, cached compiled functions shared by the tests of one session."""

    def __init__(self) -> None:
        self._steps: dict = {}
        self._forwards: dict = {}
        self.optimizer = make_optimizer(OPTIM)

    def graphs(self, algorithm):
        critic = (
            tiny_critic(algorithm.critic.kind, layers=UPDATE_LAYERS) if algorithm.critic else None
        )
        return split_models(tiny_policy(layers=UPDATE_LAYERS), critic)[0]

    def step(self, name: str, algorithm=None):
        if name not in self._steps:
            algorithm = algorithm or preset(name)
            self._steps[name] = make_update_step(
                rl_objective(algorithm, self.graphs(algorithm)),
                self.optimizer,
                epochs=algorithm.epochs,
                minibatches=algorithm.minibatches,
                shuffle=algorithm.shuffle,
                kl_controller=kl_controller(algorithm.kl),
            )
        return self._steps[name]

    def logprob_fn(self):
        if "logp" not in self._forwards:
            graphs = split_models(tiny_policy(layers=UPDATE_LAYERS))[0]
            self._forwards["logp"] = make_logprob_fn(graphs.policy)
        return self._forwards["logp"]

    def value_fn(self, kind: str):
        if kind not in self._forwards:
            critic = tiny_critic(kind, layers=UPDATE_LAYERS)
            graphs = split_models(tiny_policy(layers=UPDATE_LAYERS), critic)[0]
            self._forwards[kind] = make_value_fn(graphs)
        return self._forwards[kind]


@pytest.fixture(scope="session")
def compiled() -> Compiled:
    return Compiled()
