"""The ``irpe`` command line: parses arguments and calls library functions (imported lazily)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from irpe.commands import USER_ERRORS


def _cmd_models(args: argparse.Namespace) -> int:
    from irpe.models.summary import print_model_table

    print_model_table(img_size=args.img_size)
    return 0


def _add_models(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the registered variants with RPE config, params and MACs")
    p.add_argument("--img-size", type=int, default=224, help="input image side the MACs are counted at")
    p.set_defaults(func=_cmd_models)


def _subcommands() -> list[Callable[[argparse._SubParsersAction], None]]:
    from irpe.commands import bench, export, serve, train

    return [_add_models, export.add, train.add, serve.add, bench.add]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="irpe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in _subcommands():
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as e:
        if os.environ.get("IRPE_DEBUG"):
            raise
        print(f"irpe {args.command}: error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:  # an optional dependency: one line naming the extra (irpe.extras)
        from irpe.extras import missing_module_message

        msg = missing_module_message(e.name or "", args.command)
        if msg is None or os.environ.get("IRPE_DEBUG"):
            raise
        print(f"irpe {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
