"""`jaxrl-llm` command line: `jaxrl-llm demo [CONFIG]`.

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
    args = parser.parse_args(argv)

    if args.command == "demo":
        from jaxrl_llm import demo as demo_module

        try:
            config = demo_module.load_config(args.config or demo_module.DEFAULT_CONFIG)
        except (ConfigError, ValueError) as err:
            print(f"jaxrl-llm demo: {err}", file=sys.stderr)
            return 2
        demo_module.run(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
