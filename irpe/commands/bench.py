"""``irpe bench export`` and ``irpe bench serve``: side-by-side measurements printing ratios."""

from __future__ import annotations

import argparse


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks that print ratios measured side by side")
    bsub = p.add_subparsers(dest="bench", required=True)
    add_export_bench(bsub)
    add_serve_bench(bsub)


def add_export_bench(bsub: argparse._SubParsersAction) -> None:
    """Filled in by the export issue."""


def add_serve_bench(bsub: argparse._SubParsersAction) -> None:
    """Filled in by the serving issue."""
