"""`jaxrl-llm` command line: `jaxrl-llm demo [CONFIG]`, `jaxrl-llm convert CHECKPOINT [--out DIR]`.

User errors (a bad config) print one line naming the problem and exit with status 2, without a
traceback.
"""

from __future__ import annotations

import argparse
import sys

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
    args = parser.parse_args(argv)

    if args.command == "convert":
        return _convert(args)

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


if __name__ == "__main__":
    sys.exit(main())
