"""The ``irpe`` command line: parses arguments and calls library functions (imported lazily)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence


class CLIError(Exception):
    """A user error: printed as one line naming the fix, exit code 2."""


def _cmd_models(args: argparse.Namespace) -> int:
    from irpe.models.summary import print_model_table

    print_model_table(img_size=args.img_size)
    return 0


def _add_models(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the registered variants with RPE config, params and MACs")
    p.add_argument("--img-size", type=int, default=224)
    p.set_defaults(func=_cmd_models)


# Each entry adds one subcommand; later modules append their adders here.
SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_models]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="irpe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CLIError as e:
        print(f"irpe {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
