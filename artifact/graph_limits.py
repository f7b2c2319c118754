"""The limits every load-time graph rewrite keeps (:mod:`.ort_graph`, :mod:`.openvino_graph`).

An artifact's graph is untrusted input. The rewrites walk it back from each candidate node to the lookups
summed into it; a hostile graph can make such a walk exponential (an ``Add(x, x)`` chain doubles the paths per
node), deep (thousands of chained Reshapes) or slow (many candidates reading the same large constant).
:func:`summed_terms` walks without recursion, visits each node once per walk, stops at :data:`MAX_DEPTH` nodes
back and :data:`MAX_TERMS` terms, and checks a :class:`Budget` as it goes. A rewrite that gives up raises
:class:`RewriteRefused`; the engines then run the file as exported.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 64  # nodes walked back from a candidate (an exported lookup is under 10 deep)
MAX_TERMS = 4  # lookups summed into one node (the cross method's two per side: four)
BUDGET_S = 20.0  # one model's rewrite (an exported DeiT-S, 90 MB: 2-3 s on 2 busy cores; it grows with the file)


class RewriteRefused(Exception):
    """A graph rewrite gave up (over its time budget): the file as exported is used instead."""


class Budget:
    """A rewrite's deadline, checked as it goes."""

    def __init__(self, seconds: float = BUDGET_S):
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds

    def check(self) -> None:
        """Raises:
            RewriteRefused: the deadline has passed."""
        if time.monotonic() > self.deadline:
            raise RewriteRefused(f"the graph rewrite took longer than its {self.seconds:g} s budget")


@dataclass(frozen=True)
class Through:
    """A node whose value is the sum of ``parts`` (an Add: two; a Reshape: one)."""

    parts: tuple[Any, ...]


@dataclass(frozen=True)
class Leaf:
    """A node that ends the walk: its ``terms``, or None when it is not a lookup (the whole sum is not one)."""

    terms: list[Any] | None


def summed_terms(start: Any, expand: Callable[[Any], Through | Leaf], key: Callable[[Any], Hashable],
                 budget: Budget) -> list[Any] | None:
    """The terms summed into ``start``, in input order, or None (not a sum of lookups, deeper than
    :data:`MAX_DEPTH`, or more than :data:`MAX_TERMS` terms).

    Args:
        start: the value to walk back from.
        expand: what a value is: :class:`Through` (its parts) or :class:`Leaf` (its terms).
        key: a hashable identity for a value (each one is expanded once per walk).
        budget: checked at each step.

    Returns:
        The terms, or None.

    Raises:
        RewriteRefused: the budget ran out.
    """
    done: dict[Hashable, list[Any]] = {}
    seen: dict[Hashable, Through | Leaf] = {}
    stack = [(start, 0)]
    while stack:
        value, depth = stack[-1]
        k = key(value)
        if k in done:
            stack.pop()
            continue
        if depth > MAX_DEPTH:
            return None
        budget.check()
        node = seen[k] if k in seen else seen.setdefault(k, expand(value))
        if isinstance(node, Leaf):
            if node.terms is None or len(node.terms) > MAX_TERMS:
                return None
            done[k] = node.terms
            stack.pop()
            continue
        pending = [part for part in node.parts if key(part) not in done]
        if pending:
            stack += [(part, depth + 1) for part in reversed(pending)]
            continue
        terms = [term for part in node.parts for term in done[key(part)]]
        if len(terms) > MAX_TERMS:  # terms only add up on the way to ``start``
            return None
        done[k] = terms
        stack.pop()
    return done[key(start)]
