"""``irpe train``, ``irpe visualize``, ``irpe quickstart``."""

from __future__ import annotations

import argparse

from irpe.commands import CLIError


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quickstart", help="train (once) + export + serve the embedded digits model")
    p.add_argument("--checkpoint", help="export and serve this checkpoint instead")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.set_defaults(func=_not_built)


def _not_built(args: argparse.Namespace) -> int:
    raise CLIError(f"{args.command} is not built yet")
