"""The limits every load-time graph rewrite keeps (:mod:`.ort_graph`, :mod:`.openvino_graph`).

An artifact's graph is untrusted input. The rewrites walk it back from each candidate node to the lookups
summed into it; a hostile graph can make such a walk exponential (an ``Add(x, x)`` chain doubles the paths per
node), deep (thousands of chained Reshapes) or slow (many candidates reading the same large constant), and
a few KB of constants can ask for a table that grows with their product (two n-float one-hots make an (n, n)
index). :func:`summed_terms` walks without recursion, visits each node once per walk, stops at :data:`MAX_DEPTH`
nodes back and :data:`MAX_TERMS` terms, and checks a :class:`Budget` as it goes: a time budget, and a memory
budget that every allocation growing with a constant's size or the graph's node count is reserved against
before it is made. A rewrite that gives up raises :class:`RewriteRefused`; the engines then run the file as
exported.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 64  # nodes walked back from a candidate (an exported lookup is under 10 deep)
MAX_TERMS = 4  # lookups summed into one node (the cross method's two per side: four)
BUDGET_S = 20.0  # one model's rewrite (an exported DeiT-S, 90 MB: 2-3 s on 2 busy cores; it grows with the file)
# What one model's rewrite may hold beyond the file's bytes and the rewritten copy of them: decoded constants, the
# tables it builds (and the writer's copy of them), node records. Exported graphs at 384 px (n = 577 tokens, the
# largest tables) reserve 107 MB (DeiT-B, iRPE on q, k and v, product method) to 172 MB (iRPE on q and v, euc
# method: its (n, n, K) one-hot decoded); 224 px DeiT-S, 14 MB. 512 MB leaves 3x the largest.
MEMORY_MB = 512


class RewriteRefused(Exception):
    """A graph rewrite gave up (over its time or memory budget): the file as exported is used instead."""


class Budget:
    """A rewrite's deadline and the memory it may hold, checked as it goes."""

    def __init__(self, seconds: float = BUDGET_S, memory_mb: float = MEMORY_MB):
        self.seconds, self.memory_mb = seconds, memory_mb
        self.deadline = time.monotonic() + seconds
        self.held = 0  # bytes reserved and not released

    @classmethod
    def unlimited(cls) -> Budget:
        """A budget that never runs out (the wire reader used on its own, e.g. by tests)."""
        return cls(math.inf, math.inf)

    def check(self) -> None:
        """Raises:
            RewriteRefused: the deadline has passed."""
        if time.monotonic() > self.deadline:
            raise RewriteRefused(f"the graph rewrite took longer than its {self.seconds:g} s budget")

    def reserve(self, nbytes: int, what: str) -> None:
        """Count ``nbytes`` the rewrite is about to allocate for ``what``; call before allocating.

        Raises:
            RewriteRefused: the deadline has passed, or the bytes held would exceed the memory budget.
        """
        self.check()
        if self.held + nbytes > self.memory_mb * 2**20:
            raise RewriteRefused(f"{what} would take {nbytes / 2**20:,.0f} MB, over the graph rewrite's "
                                 f"{self.memory_mb:g} MB memory budget ({self.held / 2**20:,.0f} MB held)")
        self.held += nbytes

    def release(self, nbytes: int) -> None:
        """Give back ``nbytes`` of a :meth:`reserve` whose arrays are no longer held."""
        self.held = max(0, self.held - nbytes)


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
