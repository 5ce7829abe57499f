"""`jaxrl-llm` command line: `demo [CONFIG]`, `convert CHECKPOINT [--out DIR]`, `sample CHECKPOINT`.

User errors (a bad config) print one line naming the problem and exit with status 2, without a
traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from jaxrl_llm.config import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jaxrl-llm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="compare the policy losses on a toy verifiable task")
    demo.add_argument("config", nargs="?", default=None, help="YAML config (default: built in)")
    convert = sub.add_parser(
        "convert", help="check a local Hugging Face checkpoint and optionally re-export it"
    )
    convert.add_argument("checkpoint", help="directory with config.json and *.safetensors")
    convert.add_argument("--out", default=None, help="write the checkpoint here")
    convert.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    _add_sample_parser(sub)
    args = parser.parse_args(argv)

    if args.command == "convert":
        return _convert(args)
    if args.command == "sample":
        return _sample(args)

    if args.command == "demo":
        from jaxrl_llm import demo as demo_module

        try:
            config = demo_module.load_config(args.config or demo_module.DEFAULT_CONFIG)
        except (ConfigError, ValueError) as err:
            print(f"jaxrl-llm demo: {err}", file=sys.stderr)
            return 2
        demo_module.run(config)
    return 0


def _convert(args: argparse.Namespace) -> int:
    from jaxrl_llm.models.convert import check_checkpoint

    try:
        summary = check_checkpoint(args.checkpoint, dtype=args.dtype, out=args.out)
    except ValueError as err:
        print(f"jaxrl-llm convert: {err}", file=sys.stderr)
        return 2
    print(
        f"ok: {summary['family']}, {summary['layers']} layers, {summary['parameters']:,} "
        f"parameters, {summary['dtype']}, max |logit| {summary['max_abs_logit']:.3g}"
        + (f"; written to {summary['written']}" if summary["written"] else "")
    )
    return 0


def _add_sample_parser(sub: Any) -> None:
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
    sample.add_argument("--max-new-tokens", type=int, default=64)
    sample.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    sample.add_argument("--top-k", type=int, default=None)
    sample.add_argument("--top-p", type=float, default=None)
    sample.add_argument("--min-p", type=float, default=None)
    sample.add_argument("--num-samples", type=int, default=1, help="completions per prompt")
    sample.add_argument("--seed", type=int, default=0)
    sample.add_argument("--dtype", default="float32", help="compute dtype: float32 or bfloat16")


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
        tokenizer = load_tokenizer(args.tokenizer or args.checkpoint, chat_template=args.chat)
        model = from_pretrained(args.checkpoint, dtype=dtypes[args.dtype])
        if tokenizer.vocab_size > model.config.vocab_size:
            raise ValueError(
                f"the tokenizer has {tokenizer.vocab_size} tokens, the model only "
                f"{model.config.vocab_size}."
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
