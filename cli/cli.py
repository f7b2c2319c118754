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


DESCRIPTION = ("irpe exports vision transformers with image relative position encoding (iRPE) to ONNX, TensorRT "
               "and Triton, and serves them over HTTP and gRPC (KServe v2 / Triton protocol).")
EPILOG = ("Run 'irpe COMMAND --help' for a command's options. docs/cli.md lists every command and flag, "
          "docs/configuration.md every setting and IRPE_* variable.")


class _CommandsFormatter(argparse.HelpFormatter):
    """``irpe --help``'s layout: each command name on one line with its help (argparse measures the names
    without their indentation and would put a long one on a line of its own)."""

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if isinstance(action, argparse._SubParsersAction) and action.choices:
            indented = max(map(len, action.choices)) + self._current_indent + 2 * self._indent_increment
            self._action_max_length = max(self._action_max_length, indented)


def build_parser() -> argparse.ArgumentParser:
    """The ``irpe`` parser with every subcommand.

    Returns:
        The parser; each leaf subcommand sets ``func``, the function that runs it.
    """
    from irpe.version import package_version

    parser = argparse.ArgumentParser(prog="irpe", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=_CommandsFormatter)
    parser.add_argument("--version", action="version", version=f"irpe {package_version()}",
                        help="print the irpe-deploy version and exit")
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
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
