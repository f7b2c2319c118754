"""Every relative link and ``#anchor`` in README.md, SECURITY.md and docs/**/*.md resolves.

A link resolves when the file or folder it names exists (relative to the page) and, for a Markdown target, its
anchor equals the GitHub slug of one of that page's headings (or an explicit ``<a id=...>``/``name=``).
Links inside code (fenced blocks, inline backticks) are not links and are not checked; external links
(``https:``, ``mailto:``) are not fetched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", REPO / "SECURITY.md", *(REPO / "docs").rglob("*.md")])

_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_INLINE_CODE = re.compile(r"(`+).*?\1")
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'(][^)]*)?\)")
_REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$")
_ATX_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_SETEXT_UNDERLINE = re.compile(r"^\s{0,3}(=+|-+)\s*$")
_HTML_ANCHOR = re.compile(r"<a\s[^>]*(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


@dataclass(frozen=True)
class Link:
    """One link as written: the page it is on, its line number and its target."""

    page: Path
    line: int
    target: str


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks.

    Args:
        text: the Markdown source.

    Returns:
        (1-based line number, line) pairs.
    """
    out, fence = [], None
    for number, line in enumerate(text.splitlines(), start=1):
        match = _FENCE.match(line)
        if match:
            marker = match.group(1)
            fence = None if fence == marker else (fence or marker)
            continue
        if fence is None:
            out.append((number, line))
    return out


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text lowercased, punctuation dropped, spaces as hyphens.

    Args:
        heading: the heading's Markdown text (without the leading #).

    Returns:
        The slug, without the '#' and without the -1, -2 suffix of repeated headings.
    """
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a link may name on ``page``: heading slugs (repeats numbered as GitHub does) and HTML ids.

    Args:
        page: a Markdown file.

    Returns:
        The set of anchors, without '#'.
    """
    found: set[str] = set()
    seen: dict[str, int] = {}
    lines = prose_lines(page.read_text(encoding="utf-8"))
    for index, (number, line) in enumerate(lines):
        found.update(_HTML_ANCHOR.findall(line))
        heading = _ATX_HEADING.match(line)
        text = heading.group(2) if heading else None
        if text is None and index + 1 < len(lines) and line.strip() and not line.lstrip().startswith(("-", "|")):
            next_number, next_line = lines[index + 1]
            if next_number == number + 1 and _SETEXT_UNDERLINE.match(next_line) and "-" not in line[:1]:
                text = line.strip()
        if text is None:
            continue
        slug = github_slug(text)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(page: Path) -> list[Link]:
    """The relative links of ``page`` (inline and reference definitions), outside code.

    A link may wrap: its text, or the space after ``](``, may run over a line break.

    Args:
        page: a Markdown file.

    Returns:
        Its links that are not external (no URL scheme, not protocol-relative).
    """
    text = page.read_text(encoding="utf-8")
    prose = dict(prose_lines(text))  # fenced lines left out; inline code removed below
    lines = [_INLINE_CODE.sub("", prose.get(n, "")) for n in range(1, len(text.splitlines()) + 1)]
    joined = "\n".join(lines)
    found = [(joined.count("\n", 0, m.start()) + 1, m.group(1)) for m in _INLINE_LINK.finditer(joined)]
    found += [(n, d.group(1)) for n, line in enumerate(lines, start=1) if (d := _REFERENCE_DEF.match(line))]
    return [Link(page, number, target) for number, target in sorted(found)
            if target and not _SCHEME.match(target) and not target.startswith("//")]


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def broken(link: Link) -> str | None:
    """Why ``link`` does not resolve, or None when it does.

    Args:
        link: a relative link.

    Returns:
        A one-line reason naming the page, line and target, or None.
    """
    path_part, _, anchor = link.target.partition("#")
    target = (link.page.parent / unquote(path_part)).resolve() if path_part else link.page
    where = f"{_shown(link.page)}:{link.line}: ({link.target})"
    if not target.exists():
        return f"{where} names {_shown(target)}, which does not exist"
    if anchor and target.suffix == ".md" and unquote(anchor).lower() not in anchors(target):
        return f"{where} has no heading with the anchor #{anchor} in {_shown(target)}"
    return None


def test_slugs_follow_github():
    assert github_slug("Many front ends, one engine: `--frontends N`") == "many-front-ends-one-engine---frontends-n"
    assert github_slug("Install") == "install"
    assert github_slug("Performance at a glance (CPU)") == "performance-at-a-glance-cpu"
    assert github_slug("[Link](x.md) and **bold** and model_json") == "link-and-bold-and-model_json"


def test_links_are_found_outside_code(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n[ok](#top) [gone](missing.md) `[code](no.md)`\n\n```\n[fenced](no2.md)\n```\n"
                    "[ext](https://example.com) [ref]: other.md#x\n[split\nover lines](\nwrapped.md)\n")
    assert [lk.target for lk in links(page)] == ["#top", "missing.md", "wrapped.md"]
    assert [lk.line for lk in links(page)] == [3, 3, 9]
    assert broken(Link(page, 3, "#top")) is None
    assert broken(Link(page, 3, "#nowhere")) is not None


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_resolves(page):
    problems = [reason for link in links(page) if (reason := broken(link))]
    assert not problems, "broken links (fix the target or the heading):\n" + "\n".join(problems)
