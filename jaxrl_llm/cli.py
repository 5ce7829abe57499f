"""`jaxrl-llm` command line.

    jaxrl-llm train CONFIG.yaml [key.sub=value ...] [--resume] [--run-dir DIR]
    jaxrl-llm eval CONFIG.yaml [key.sub=value ...] [--checkpoint STEP|latest|none] [--prompts N]
        [--run-dir DIR]
    jaxrl-llm plan MODEL [--mesh D,F,T | --devices N] ...
    jaxrl-llm demo [--run-dir DIR] [--fresh] [--sft KEY=VALUE ...] [--rl KEY=VALUE ...]
    jaxrl-llm convert CHECKPOINT [--out DIR] | sample CHECKPOINT --prompt TEXT

User errors (a bad config, an unknown override key, a bad path, nothing to resume) print one
line naming the problem and exit with status 2, without a traceback. A training run that stops
because its loss diverged, or because a reward function failed under `on_failure: fail`, prints
the diagnosis and exits with status 1; one stopped by SIGTERM / Ctrl-C checkpoints and exits
with 128 + the signal number (143 / 130). `JAXRL_LLM_TRACEBACK=1` prints a user error's whole
traceback too (a `ValueError` from deep in the library is shown as a user error: this says
where it was raised).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shlex
import sys
from typing import Any

from jaxrl_llm.config import ConfigError

# Commands that run XLA programs long enough to gain from huge pages: run as a program (argv
# None), they re-execute once with glibc's huge-page tunable (jaxrl_llm.hugepages).
HUGEPAGE_COMMANDS = ("train", "eval", "demo", "sample")


def main(argv: list[str] | None = None) -> int:
    # `python -m` imports modules of the current directory; the `jaxrl-llm` script alone would
    # not, so `fn: "my_rewards:score"` beside the config would fail (appended: never shadows)
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    parser = argparse.ArgumentParser(
        prog="jaxrl-llm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_demo_parser(sub)
    convert = sub.add_parser(
        "convert", help="check a local Hugging Face checkpoint and optionally re-export it"
    )
    convert.add_argument("checkpoint", help="directory with config.json and *.safetensors")
    convert.add_argument("--out", default=None, help="write the checkpoint here")
    convert.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    _add_sample_parser(sub)
    _add_run_parsers(sub)
    from jaxrl_llm.plan import build_parser as build_plan_parser

    build_plan_parser(
        sub.add_parser("plan", help="per-device memory and time of an RL iteration on a mesh")
    )
    args, unknown = parser.parse_known_args(argv)
    if args.command in ("train", "eval"):
        extra = [u for u in unknown if "=" in u and not u.startswith("-")]
        unknown = [u for u in unknown if u not in extra]
        args.overrides = [*args.overrides, *extra]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if argv is None and args.command in HUGEPAGE_COMMANDS:
        from jaxrl_llm.hugepages import reexec_with_hugepages

        try:
            reexec_with_hugepages()
        except ValueError as e:
            parser.error(str(e))

    if args.command == "convert":
        return _convert(args)
    if args.command == "sample":
        return _sample(args)
    if args.command == "train":
        _log_to_stderr()
        return _train(args)
    if args.command == "eval":
        _log_to_stderr()
        return _eval(args)
    if args.command == "plan":
        from jaxrl_llm.plan import run as run_plan

        return run_plan(args)

    if args.command == "demo":
        return _demo(args)
    return 0


def _add_demo_parser(sub: Any) -> None:
    demo = sub.add_parser(
        "demo",
        help="SFT on a noisy teacher, then GRPO with a verifier reward (docs/demo.md)",
        allow_abbrev=False,
    )
    demo.add_argument("--run-dir", default="runs/demo", help="the demo's directory")
    demo.add_argument(
        "--fresh", action="store_true", help="train the SFT stage again even when it is cached"
    )
    demo.add_argument(
        "--sft",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key of configs/demo_sft.yaml (repeatable)",
    )
    demo.add_argument(
        "--rl",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key of configs/demo_grpo.yaml (repeatable)",
    )


def _demo(args: argparse.Namespace) -> int:
    import signal

    from jaxrl_llm.data.records import DataError
    from jaxrl_llm.demo import DemoInterruptedError, check_stage_dirs, demo_configs, run_demo
    from jaxrl_llm.rewards import RewardFunctionError
    from jaxrl_llm.runner import TrainingDivergedError

    _log_to_stderr()
    try:  # every user error before anything runs
        demo_configs(args.run_dir, sft_overrides=args.sft, rl_overrides=args.rl)
        check_stage_dirs(args.run_dir)
        pathlib.Path(args.run_dir).mkdir(parents=True, exist_ok=True)
    except ValueError as err:
        return _user_error("demo", err)
    except OSError as err:
        message = f"--run-dir: {args.run_dir} cannot be created ({err})."
        return _user_error("demo", OSError(message))
    try:
        run_demo(args.run_dir, sft_overrides=args.sft, rl_overrides=args.rl, fresh=args.fresh)
    except (ConfigError, DataError) as err:  # found when a stage starts (e.g. a bad path)
        return _user_error("demo", err)
    except (TrainingDivergedError, RewardFunctionError) as err:
        print(f"jaxrl-llm demo: {err}", file=sys.stderr)
        return 1
    except DemoInterruptedError as err:  # the stage's step finished and was saved; the demo stops
        print(f"jaxrl-llm demo: {err}", file=sys.stderr)
        return 128 + int(signal.Signals[err.signal_name])
    except KeyboardInterrupt:  # a second Ctrl-C, or one before a stage's first step
        print("jaxrl-llm demo: interrupted (SIGINT)", file=sys.stderr)
        return 128 + signal.SIGINT
    return 0


def _add_run_parsers(sub: Any) -> None:
    train = sub.add_parser(
        "train", help="run a training run from a YAML config", allow_abbrev=False
    )
    train.add_argument("config", help="the run's YAML config (e.g. configs/grpo.yaml)")
    train.add_argument(
        "overrides",
        nargs="*",
        default=[],
        help="config overrides KEY.SUB=VALUE (values parsed as YAML)",
    )
    train.add_argument(
        "--resume", action="store_true", help="continue from the run's newest checkpoint"
    )
    train.add_argument("--run-dir", default=None, help="run directory (default: runs/<config>)")
    evaluate = sub.add_parser(
        "eval", help="evaluate a run's checkpoint on the eval split", allow_abbrev=False
    )
    evaluate.add_argument("config", help="the run's YAML config")
    evaluate.add_argument("overrides", nargs="*", default=[], help="config overrides KEY.SUB=VALUE")
    evaluate.add_argument(
        "--checkpoint", default="latest", help="a step, 'latest' (default) or 'none' (untrained)"
    )
    evaluate.add_argument("--run-dir", default=None, help="run directory (default: runs/<config>)")
    evaluate.add_argument(
        "--prompts", type=int, default=None, help="eval prompts (default: train.eval_prompts)"
    )


TRACEBACK_ENV = "JAXRL_LLM_TRACEBACK"


def _user_error(command: str, err: BaseException) -> int:
    """One line naming the problem, exit status 2; the traceback too with `JAXRL_LLM_TRACEBACK=1`."""
    if os.environ.get(TRACEBACK_ENV, "").strip().lower() not in ("", "0", "false", "no"):
        import traceback

        traceback.print_exception(err, file=sys.stderr)
    message = " ".join(str(err).split("\n")[0].split())
    print(f"jaxrl-llm {command}: {message}", file=sys.stderr)
    return 2


def _resume_command(args: argparse.Namespace, run_dir: str) -> str:
    parts = ["jaxrl-llm", "train", args.config, *args.overrides, "--resume", "--run-dir", run_dir]
    return " ".join(shlex.quote(p) for p in parts)


def _log_to_stderr() -> None:
    """Show the library's INFO / WARNING messages (warm start, skipped steps) on stderr.

    Adds a handler only when logging is not configured yet (no root handler), so an embedding
    application or a test harness keeps its own.
    """
    import logging

    logger = logging.getLogger("jaxrl_llm")
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False  # a library may configure the root logger later


def _train(args: argparse.Namespace) -> int:
    import logging
    import signal

    from jaxrl_llm.data.records import DataError
    from jaxrl_llm.rewards import RewardFunctionError
    from jaxrl_llm.runner import TrainingDivergedError, load_run_config, prepare_run, run_training
    from sharding import initialize_distributed, is_main_process

    try:
        # a multi-host job (JAXRL_* settings or a cluster launcher JAX recognises) joins its
        # processes before JAX is used; a no-op on one machine (docs/running.md)
        initialize_distributed()
        if not is_main_process():  # process 0 speaks for the job; the others report errors
            logging.getLogger("jaxrl_llm").setLevel(logging.ERROR)
        config = load_run_config(args.config, args.overrides, run_dir=args.run_dir)
        prepared = prepare_run(config, resume=args.resume)
    except (ConfigError, DataError, ValueError) as err:
        return _user_error("train", err)
    except KeyboardInterrupt:  # Ctrl-C while the model, the warm start or a restore is set up
        print("jaxrl-llm train: interrupted (SIGINT) before the first step", file=sys.stderr)
        return 128 + signal.SIGINT
    try:
        summary = run_training(prepared, resume_command=_resume_command(args, config.run_dir))
    except (TrainingDivergedError, RewardFunctionError) as err:
        print(f"jaxrl-llm train: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a second Ctrl-C stops at once, without a new checkpoint
        print(
            "jaxrl-llm train: interrupted at once (a second SIGINT); resume from the newest "
            f"checkpoint with: {_resume_command(args, config.run_dir)}",
            file=sys.stderr,
        )
        return 128 + signal.SIGINT
    if summary["interrupted"]:
        return 128 + int(signal.Signals[summary["interrupted"]])
    if not is_main_process():
        return 0
    before, after = summary["accuracy_before_rl"], summary["accuracy_after_rl"]
    change = "" if before is None else f"; eval accuracy {before:.3f} -> {after:.3f}"
    print(
        f"jaxrl-llm train: done, {summary['steps']} steps in {summary['wall_seconds']:.1f} s"
        f"{change}; summary in {config.run_dir}/summary.json"
    )
    return 0


def _eval(args: argparse.Namespace) -> int:
    from jaxrl_llm.data.records import DataError
    from jaxrl_llm.runner import load_run_config
    from jaxrl_llm.runner.eval_run import evaluate_run, format_eval_table, parse_checkpoint

    try:
        config = load_run_config(args.config, args.overrides, run_dir=args.run_dir)
        label, metrics, path = evaluate_run(
            config, checkpoint=parse_checkpoint(args.checkpoint), num_prompts=args.prompts
        )
    except (ConfigError, DataError, ValueError) as err:
        return _user_error("eval", err)
    print(format_eval_table(label, metrics))
    print(f"written to {path}")
    return 0


def _convert(args: argparse.Namespace) -> int:
    from jaxrl_llm.models.convert import check_checkpoint

    try:
        summary = check_checkpoint(args.checkpoint, dtype=args.dtype, out=args.out)
    except (ValueError, OSError) as err:  # OSError: an --out that cannot be written
        print(f"jaxrl-llm convert: {err}", file=sys.stderr)
        return 2
    print(
        f"ok: {summary['family']}, {summary['layers']} layers, {summary['parameters']:,} "
        f"parameters, {summary['dtype']}, max |logit| {summary['max_abs_logit']:.3g}"
        + (f"; written to {summary['written']}" if summary["written"] else "")
    )
    return 0


def _add_sample_parser(sub: Any) -> None:
    from jaxrl_llm.plan.report import float_in, positive_int

    sample = sub.add_parser(
        "sample", help="sample completions of prompts from a local Hugging Face checkpoint"
    )
    sample.add_argument("checkpoint", help="directory with config.json and *.safetensors")
    sample.add_argument(
        "--prompt", action="append", required=True, help="a prompt text (repeat for several)"
    )
    sample.add_argument(
        "--tokenizer", default=None, help="tokenizer directory or 'byte' (default: CHECKPOINT)"
    )
    sample.add_argument("--chat", action="store_true", help="render prompts with the chat template")
    sample.add_argument("--max-new-tokens", type=positive_int, default=64)
    sample.add_argument("--temperature", type=float_in(0.0), default=1.0, help="0 = greedy")
    sample.add_argument("--top-k", type=positive_int, default=None)
    sample.add_argument("--top-p", type=float_in(0.0, 1.0, open_low=True), default=None)
    sample.add_argument("--min-p", type=float_in(0.0, 1.0), default=None)
    sample.add_argument(
        "--num-samples", type=positive_int, default=1, help="completions per prompt"
    )
    sample.add_argument(
        "--stop",
        action="append",
        default=None,
        help="a stop string: a completion ends once its text contains it (repeat for several)",
    )
    sample.add_argument("--seed", type=int, default=0)
    sample.add_argument("--dtype", default="float32", help="compute dtype: float32 or bfloat16")
    sample.add_argument(
        "--answer",
        action="append",
        default=None,
        help="reference answer of each prompt, in order (repeat): prints exact-match pass@k",
    )


def _sample(args: argparse.Namespace) -> int:
    import jax
    import jax.numpy as jnp

    from jaxrl_llm.models import from_pretrained
    from jaxrl_llm.sampler.text import sample_texts
    from jaxrl_llm.tokenizer import load_tokenizer

    dtypes = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
    try:
        if args.dtype not in dtypes:
            raise ValueError(f"--dtype must be one of {sorted(dtypes)}, got {args.dtype!r}.")
        if not os.path.isdir(args.checkpoint):
            raise ValueError(f"{args.checkpoint} is not a checkpoint directory.")
        tokenizer = load_tokenizer(args.tokenizer or args.checkpoint, chat_template=args.chat)
        model = from_pretrained(args.checkpoint, dtype=dtypes[args.dtype])
        if tokenizer.vocab_size > model.config.vocab_size:
            raise ValueError(
                f"the tokenizer has {tokenizer.vocab_size} tokens, the model only "
                f"{model.config.vocab_size}."
            )
        if args.answer is not None and len(args.answer) != len(args.prompt):
            raise ValueError(
                f"--answer: give one per --prompt ({len(args.prompt)}), got {len(args.answer)}."
            )
        samples = sample_texts(
            model,
            tokenizer,
            args.prompt,
            key=jax.random.key(args.seed),
            max_new_tokens=args.max_new_tokens,
            num_samples=args.num_samples,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            stop_strings=tuple(args.stop or ()),
        )
    except ValueError as err:
        print(f"jaxrl-llm sample: {err}", file=sys.stderr)
        return 2
    for s in samples:
        end = "truncated" if s.truncated else "stopped"
        print(
            f"[prompt {s.prompt_index} sample {s.sample_index}] {s.num_tokens} tokens, {end}, "
            f"logprob {s.logprob:.3f}"
        )
        print(s.text)
    if args.answer is not None:
        print(_pass_at_k_line(samples, args.answer, args.num_samples, tuple(args.stop or ())))
    return 0


def _pass_at_k_line(
    samples: list[Any], answers: list[str], num_samples: int, stops: tuple[str, ...] = ()
) -> str:
    """`pass@k` (unbiased, exact match of the completion text without the stop string it
    ends with) for k = 1, 2, 4, ... and n."""
    import numpy as np

    from jaxrl_llm.runner.evaluate import pass_at_k

    def answer_text(text: str) -> str:
        ending = next((stop for stop in stops if text.endswith(stop)), "")
        return text.removesuffix(ending) if ending else text

    correct = np.zeros(len(answers), np.int64)
    for s in samples:
        correct[s.prompt_index] += int(answer_text(s.text) == answers[s.prompt_index])
    ks = sorted({min(2**i, num_samples) for i in range(num_samples.bit_length())} | {num_samples})
    scores = "  ".join(f"pass@{k} {pass_at_k(num_samples, correct, k).mean():.3f}" for k in ks)
    return f"exact match over {len(answers)} prompts x {num_samples} samples: {scores}"


if __name__ == "__main__":
    sys.exit(main())
