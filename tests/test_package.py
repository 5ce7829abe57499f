"""Package-level contracts: light imports, the stable API of DESIGN.md, documented public names."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import losses
import sharding

HEAVY = ("flax", "optax", "orbax", "transformers", "tensorflow_datasets", "tensorflow", "torch")

# DESIGN.md "Public API of `losses` (stable names)" — these must stay importable from the root.
STABLE_LOSSES_API = (
    "masked_sum masked_mean masked_var masked_whiten aggregate token_logprobs entropy_from_logits "
    "kl_estimate group_advantages rloo_advantages gae discounted_returns reinforce_pp_advantages "
    "reinforce_pp_baseline_advantages remax_advantages opo_advantages passk_advantages "
    "bnpo_advantages gdpo_advantages min_form_returns ppo_clip_loss gspo_loss sapo_loss cispo_loss "
    "gmpo_loss reinforce_loss clip_cov_loss kl_cov_loss bapo_clip_bounds value_loss "
    "rollout_correction_weights high_entropy_mask"
).split()


@pytest.mark.parametrize("package", ["losses", "sharding"])
def test_import_pulls_in_nothing_heavier_than_jax(package):
    code = f"import sys, {package}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_importing_the_package_does_not_start_a_jax_backend():
    # `jax.distributed.initialize` (multi-host runs, `jaxrl-llm train`) must come before any
    # backend start-up, so importing the package (its config tables, presets) must not start one
    code = (
        "import jax._src.xla_bridge as xb, jaxrl_llm.cli, jaxrl_llm.runner, jaxrl_llm.train; "
        "print(bool(xb._backends))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_stable_api_names_exist():
    missing = [name for name in STABLE_LOSSES_API if not hasattr(losses, name)]
    assert not missing, f"losses is missing DESIGN.md names: {missing}"
    assert set(STABLE_LOSSES_API) <= set(losses.__all__)


@pytest.mark.parametrize("package", [losses, sharding], ids=lambda p: p.__name__)
def test_every_public_name_is_exported_and_documented_with_an_example(package):
    undocumented = []
    for name in package.__all__:
        obj = getattr(package, name)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        doc = inspect.getdoc(obj) or ""
        if "Examples:" not in doc or ">>>" not in doc:
            undocumented.append(name)
    assert not undocumented, f"public names without a doctest example: {undocumented}"


def test_all_lists_every_public_module_level_function():
    import pkgutil

    exported = set(losses.__all__)
    forgotten = []
    for info in pkgutil.iter_modules(losses.__path__):
        if info.name.startswith("_"):
            continue
        module = __import__(f"losses.{info.name}", fromlist=["*"])
        for name, obj in vars(module).items():
            if (
                inspect.isfunction(obj)
                and obj.__module__ == module.__name__
                and not name.startswith("_")
                and name not in exported
            ):
                forgotten.append(f"{info.name}.{name}")
    assert not forgotten, f"public functions missing from losses.__all__: {forgotten}"
