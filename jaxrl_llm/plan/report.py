"""The `jaxrl-llm plan` command: a readable report or JSON of `estimate`'s plans."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Callable
from typing import Any

from jaxrl_llm.plan.devices import DEVICES, GiB
from jaxrl_llm.plan.estimate import _DTYPE_BYTES, Plan, PlanConfig, estimate, suggest_meshes
from jaxrl_llm.plan.shapes import PRESETS

_MEMORY_ROWS = (
    ("params", "parameters ({param})"),
    ("optimizer", "AdamW moments (2 × {opt})"),
    ("accumulator", "gradient accumulator (float32, micro-batches)"),
    ("gradients", "gradients ({param})"),
    ("reference", "reference policy ({param})"),
    ("layer_buffers", "gathered layer weights"),
    ("activations", "training activations (remat={remat})"),
    ("sampler_weights", "sampler weights ({param}, gathered, split over tensor)"),
    ("kv_cache", "KV cache ({compute})"),
    ("sampling_workspace", "sampling workspace"),
    ("critic_params", "critic parameters ({param})"),
    ("critic_optimizer", "critic AdamW moments (2 × {opt})"),
    ("critic_gradients", "critic gradients ({param})"),
    ("critic_activations", "critic training activations"),
)


def format_plan(p: Plan) -> str:
    """A human-readable report of `p`: memory per device and the time split.

    Examples:
      >>> p = estimate("qwen3-0.6b", PlanConfig(batch=4, group_size=2), "h100")
      >>> print(format_plan(p).splitlines()[0])
      qwen3-0.6b: 0.60 B parameters on 1 × H100 SXM (74.5 GiB), mesh data=1 fsdp=1 tensor=1
    """
    c, m, t = p.config, p.memory, p.time
    d, f, tp = c.mesh
    opt = c.optimizer_dtype or c.param_dtype
    labels = {"param": c.param_dtype, "opt": opt, "compute": c.compute_dtype}
    lines = [
        f"{p.model}: {p.num_params / 1e9:.2f} B parameters on {d * f * tp} × {p.device.name} "
        f"({p.device.hbm_bytes / GiB:.1f} GiB), mesh data={d} fsdp={f} tensor={tp}",
        f"rollout: {c.batch} prompts × {c.group_size} samples = {c.num_sequences} sequences of "
        f"{c.prompt_len} + {c.completion_len} tokens; micro-batch "
        f"{c.micro_batch or c.num_sequences // c.minibatches}, {c.epochs} epoch(s) × "
        f"{c.minibatches} update(s)"
        + (
            f"; {'DoRA' if c.dora else 'LoRA'} rank {c.lora_rank} on every projection (only the "
            "adapters train)"
            if c.lora_rank
            else ""
        )
        + (
            "; a separate critic"
            + (
                f" with {'DoRA' if c.dora else 'LoRA'} rank {c.critic_lora_rank}"
                if c.critic_lora_rank
                else ""
            )
            if c.critic
            else ""
        ),
        "memory per device (GiB):",
    ]
    for key, label in _MEMORY_ROWS:
        if (key == "reference" and not c.reference) or (key.startswith("critic") and not c.critic):
            continue
        text = label.format(**labels, remat=c.remat)
        lines.append(f"  {text:<46} {m[key] / GiB:9.2f}")
    verdict = "fits" if p.fits else "DOES NOT FIT"
    lines += [
        f"  {'peak while sampling':<46} {m['sampling_peak'] / GiB:9.2f}",
        f"  {'peak while training':<46} {m['training_peak'] / GiB:9.2f}",
        f"  {'peak':<46} {m['peak'] / GiB:9.2f}  ({verdict}; "
        f"{100 * m['peak'] / p.device.hbm_bytes:.0f}% of HBM)",
        f"time per iteration (estimate, mfu={c.mfu}, bandwidth efficiency "
        f"{c.bandwidth_efficiency}):",
        f"  sampling  {t['sampling_s']:9.2f} s  (prefill {t['prefill_s']:.2f} s, decode "
        f"{c.completion_len} steps × {1e3 * t['decode_step_s']:.2f} ms, {p.decode_bound}-bound)",
        f"  training  {t['training_total_s']:9.2f} s  (update {t['training_s']:.2f} s, log-prob "
        f"passes {t['logprob_s']:.2f} s)",
        f"  collectives {t['train_comm_s']:7.2f} s  (training, if not overlapped with compute)",
    ]
    total = p.iteration_s
    lines.append(
        f"  split     {100 * t['sampling_s'] / total:5.1f}% sampling / "
        f"{100 * t['training_total_s'] / total:5.1f}% training, {total:.2f} s per iteration"
    )
    lines += [f"note: {note}" for note in p.notes]
    return "\n".join(lines)


def plan_to_dict(p: Plan) -> dict[str, Any]:
    """A JSON-ready mapping of `p` (bytes, seconds, the inputs).

    Examples:
      >>> d = plan_to_dict(estimate("qwen3-0.6b", PlanConfig(batch=4, group_size=2), "h100"))
      >>> sorted(d)[:4]
      ['config', 'decode_bound', 'device', 'fits']
    """
    return {
        "model": p.model,
        "num_params": p.num_params,
        "device": dataclasses.asdict(p.device),
        "config": dataclasses.asdict(p.config),
        "memory_bytes": dict(p.memory),
        "time_s": dict(p.time),
        "decode_bound": p.decode_bound,
        "fits": p.fits,
        "notes": list(p.notes),
    }


def _parse_mesh(text: str) -> tuple[int, int, int]:
    parts = text.replace("x", ",").split(",")
    try:
        mesh = tuple(int(s) for s in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--mesh must be DATA,FSDP,TENSOR (e.g. 1,8,1), got {text!r}"
        ) from None
    if len(mesh) != 3:
        raise argparse.ArgumentTypeError(f"--mesh needs three sizes DATA,FSDP,TENSOR, got {text!r}")
    return mesh  # type: ignore[return-value]


def positive_int(text: str) -> int:
    """An argparse `type`: a positive integer, else argparse's one-line error naming the flag.

    Examples:
      >>> positive_int("8")
      8
      >>> positive_int("0")
      Traceback (most recent call last):
      ...
      argparse.ArgumentTypeError: must be a positive integer, got '0'
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def float_in(low: float, high: float = math.inf, *, open_low: bool = False) -> Callable:
    """An argparse `type`: a float in [low, high] ((low, high] with `open_low`), else
    argparse's one-line error naming the flag.

    Examples:
      >>> float_in(0.0, 1.0, open_low=True)("0.9")
      0.9
      >>> float_in(0.0)("-1")
      Traceback (most recent call last):
      ...
      argparse.ArgumentTypeError: must be a number >= 0, got '-1'
    """
    bounds = f"in ({low:g}, {high:g}]" if open_low else f"in [{low:g}, {high:g}]"
    if high == math.inf:
        bounds = f"> {low:g}" if open_low else f">= {low:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not ((low < value if open_low else low <= value) and value <= high):  # NaN fails
            raise argparse.ArgumentTypeError(f"must be a number {bounds}, got {text!r}")
        return value

    return parse


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The `plan` command's arguments (on `parser`, e.g. a `jaxrl-llm` subparser).

    Examples:
      >>> args = build_parser().parse_args(["qwen2.5-7b", "--mesh", "1,8,1"])
      >>> args.model, args.mesh
      ('qwen2.5-7b', (1, 8, 1))
    """
    p = parser or argparse.ArgumentParser(
        prog="jaxrl-llm plan", description="Per-device memory and time split of an RL iteration."
    )
    p.add_argument("model", help=f"preset ({', '.join(PRESETS)}) or config.json / checkpoint dir")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--mesh", type=_parse_mesh, help="DATA,FSDP,TENSOR (default 1,1,1)")
    where.add_argument("--devices", type=positive_int, help="rank every mesh of this many devices")
    p.add_argument("--device", default="h100", choices=sorted(DEVICES), help="accelerator")
    p.add_argument("--prompt-len", type=positive_int, default=PlanConfig.prompt_len)
    p.add_argument("--completion-len", type=positive_int, default=PlanConfig.completion_len)
    p.add_argument(
        "--batch", type=positive_int, default=PlanConfig.batch, help="prompts per iteration"
    )
    p.add_argument("--group-size", type=positive_int, default=PlanConfig.group_size)
    p.add_argument(
        "--micro-batch", type=positive_int, default=None, help="sequences per fwd/bwd pass"
    )
    p.add_argument("--epochs", type=positive_int, default=PlanConfig.epochs)
    p.add_argument(
        "--minibatches", type=positive_int, default=PlanConfig.minibatches, help="updates per epoch"
    )
    p.add_argument("--param-dtype", default=PlanConfig.param_dtype, choices=sorted(_DTYPE_BYTES))
    p.add_argument(
        "--compute-dtype", default=PlanConfig.compute_dtype, choices=sorted(_DTYPE_BYTES)
    )
    p.add_argument(
        "--optimizer-dtype",
        default=PlanConfig.optimizer_dtype,
        choices=sorted(_DTYPE_BYTES),
        help="AdamW moments (default: the parameters' dtype, as optax keeps them)",
    )
    p.add_argument("--remat", default=PlanConfig.remat, choices=["none", "dots", "full"])
    p.add_argument("--reference", action="store_true", help="hold a frozen KL reference policy")
    p.add_argument(
        "--old-logprobs",
        default=PlanConfig.old_logprobs,
        choices=["forward", "sampler"],
        help="where a reused batch's old log-probs come from (algorithm.old_logprobs)",
    )
    p.add_argument(
        "--lora-rank", type=positive_int, default=None, help="train LoRA adapters of this rank"
    )
    p.add_argument("--dora", action="store_true", help="the adapters are DoRA's (magnitudes)")
    p.add_argument("--critic", action="store_true", help="PPO's separate critic (a value model)")
    p.add_argument(
        "--critic-lora-rank",
        type=positive_int,
        default=None,
        help="the critic's LoRA adapters' rank",
    )
    p.add_argument(
        "--logits-chunk", type=positive_int, default=None, help="tokens of logits at once"
    )
    p.add_argument(
        "--attention-chunk", type=positive_int, default=None, help="queries per attention block"
    )
    p.add_argument("--mfu", type=float, default=PlanConfig.mfu)
    p.add_argument("--bandwidth-efficiency", type=float, default=PlanConfig.bandwidth_efficiency)
    p.add_argument("--top", type=positive_int, default=5, help="meshes listed with --devices")
    p.add_argument("--json", action="store_true", help="print JSON instead of the report")
    return p


def run(args: argparse.Namespace) -> int:
    """Run the `plan` command on parsed arguments; returns the exit status (2: bad input).

    Examples:
      >>> run(build_parser().parse_args(["qwen3-0.6b", "--batch", "4", "--json"]))
      [...]
      0
    """
    try:
        config = PlanConfig(
            mesh=args.mesh or (1, 1, 1),
            prompt_len=args.prompt_len,
            completion_len=args.completion_len,
            batch=args.batch,
            group_size=args.group_size,
            micro_batch=args.micro_batch,
            epochs=args.epochs,
            minibatches=args.minibatches,
            param_dtype=args.param_dtype,
            compute_dtype=args.compute_dtype,
            optimizer_dtype=args.optimizer_dtype,
            remat=args.remat,
            reference=args.reference,
            old_logprobs=args.old_logprobs,
            lora_rank=args.lora_rank,
            critic=args.critic,
            critic_lora_rank=args.critic_lora_rank,
            dora=args.dora,
            logits_chunk=args.logits_chunk,
            attention_chunk=args.attention_chunk,
            mfu=args.mfu,
            bandwidth_efficiency=args.bandwidth_efficiency,
        )
        if args.top < 1:
            raise ValueError(f"--top: must be >= 1, got {args.top}.")
        if args.devices is not None:
            plans = suggest_meshes(args.model, config, args.device, args.devices)[: args.top]
        else:
            plans = [estimate(args.model, config, args.device)]
    except ValueError as err:
        print(f"jaxrl-llm plan: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([plan_to_dict(p) for p in plans], indent=2))
    else:
        print("\n\n".join(format_plan(p) for p in plans))
    return 0


def main(argv: list[str] | None = None) -> int:
    """`jaxrl-llm plan MODEL [--mesh D,F,T | --devices N] ...`: print the plan.

    Examples:
      >>> main(["llama-3-70b", "--mesh", "1,3,1"])  # the 64 prompts do not split over fsdp=3
      2
    """
    return run(build_parser().parse_args(argv))
