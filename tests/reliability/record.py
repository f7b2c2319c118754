"""What the reliability tests sent and what came back, for the summary table at the end of the run."""

from __future__ import annotations

import collections
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
RECORDS: list[tuple[str, str, int, str]] = []  # (group, input, status, error code or "")


def record(group: str, name: str, response: httpx.Response) -> None:
    code = ""
    if response.status_code >= 400:
        try:
            code = str(response.json()["error"]["code"])
        except (ValueError, KeyError, TypeError):
            code = "<not the JSON error shape>"
    RECORDS.append((group, name, response.status_code, code))


def summary_table() -> str:
    """A Markdown table of every input, then the counts by group and status."""
    lines = ["| group | input | status | error code |", "|---|---|---|---|"]
    counts: collections.Counter[tuple[str, int]] = collections.Counter()
    for group, name, status, code in RECORDS:
        counts[(group, status)] += 1
        if group == "bad-input":
            lines.append(f"| {group} | {name} | {status} | {code} |")
    lines += ["", "| group | status | answers |", "|---|---|---|"]
    lines += [f"| {g} | {s} | {n} |" for (g, s), n in sorted(counts.items())]
    return "\n".join(lines)


def write_summary() -> Path:
    out = REPO / "test-artifacts" / "reliability-answers.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(summary_table() + "\n")
    return out
