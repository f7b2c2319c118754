"""``irpe serve`` and ``irpe classify``."""

from __future__ import annotations

import argparse


def add(sub: argparse._SubParsersAction) -> None:
    """Registers nothing yet (the serving issue adds serve and classify)."""
