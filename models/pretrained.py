"""Published iRPE checkpoints by name: the authors' release files, downloaded once into a cache.

``download_pretrained(name)`` returns the cached file, fetching it when needed:

- source: the authors' model zoo (``RELEASE_URL`` + ``<name>.pth``, linked from microsoft/Cream's
  iRPE README), or ``$IRPE_MODEL_MIRROR/<name>.pth`` (an internal mirror: same file names);
- cache: ``$IRPE_CACHE``, else ``~/.cache/irpe/checkpoints``, owned by you and writable by nobody else, its files
  never opened through links (:mod:`.cache`); a download goes to ``<file>.part`` (with a progress bar on
  stderr) and resumes from there with an HTTP Range request (``If-Range`` on the server's validator); a 206
  answer is used only when its validator and total length are the saved ones, else the download restarts
  from byte 0; ``<file>.part`` is renamed atomically to ``<file>`` only after its sha256 checks out;
- digests: pinned in ``PUBLISHED`` where known (the zoo publishes none today), otherwise recorded in
  ``<file>.sha256`` on the first download and checked on every later use (trust on first use). Only a
  body that came whole, in one response with a Content-Length, is recorded: a resumed body or one
  without a length (a cut-off one looks complete) is used once, marked ``<file>.unpinned``, and downloaded
  again on its next use; that download is pinned when it arrives whole or matches the first;
- offline (``IRPE_OFFLINE=1`` or ``offline=True``): only the cache is used.

Every failure raises :class:`DownloadError` with one line saying what happened and what to do; nothing
but ``*.part`` (the resume state) is ever left behind for an incomplete or wrong file.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from .cache import CacheDir, CacheError
from .registry import released_models

RELEASE_URL = "https://github.com/wkcn/iRPE-model-zoo/releases/download/1.0/"
CHUNK = 1 << 16
RECORD, UNPINNED, META = ".sha256", ".unpinned", ".json"  # <file>.sha256, <file>.unpinned, <file>.part.json


@dataclass(frozen=True)
class Release:
    """One published checkpoint: its file name in the release and its sha256 when known."""

    filename: str
    sha256: str | None = None


#: The variants with released weights, as the registry marks them (the other variants have none).
PUBLISHED: dict[str, Release] = {name: Release(f"{name}.pth") for name in released_models()}


class DownloadError(ValueError):
    """A pretrained checkpoint could not be fetched or verified (the message names the fix)."""


def cache_dir() -> Path:
    """``$IRPE_CACHE``, else ``~/.cache/irpe/checkpoints``."""
    return Path(os.environ.get("IRPE_CACHE") or Path.home() / ".cache" / "irpe" / "checkpoints").expanduser()


def release(name: str) -> Release:
    """The release entry of ``name``; DownloadError listing the published names otherwise."""
    if name not in PUBLISHED:
        raise DownloadError(f"{name!r} has no released weights; published: {', '.join(PUBLISHED)}")
    return PUBLISHED[name]


def pretrained_url(name: str) -> str:
    """Where ``name`` is fetched from: ``$IRPE_MODEL_MIRROR`` when set, else the authors' release."""
    base = os.environ.get("IRPE_MODEL_MIRROR") or RELEASE_URL
    return base.rstrip("/") + "/" + release(name).filename


def _offline() -> bool:
    return os.environ.get("IRPE_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def download_pretrained(name: str, progress: bool = True, offline: bool | None = None,
                        timeout: float = 30.0) -> Path:
    """The cached checkpoint file of a published variant, downloaded when missing or unpinned.

    Args:
        name: a variant with released weights (:data:`PUBLISHED`).
        progress: show a progress bar on stderr.
        offline: use only the cache; None reads ``IRPE_OFFLINE``.
        timeout: seconds to wait on the network per request.

    Returns:
        The path of the verified file in the cache.

    Raises:
        DownloadError: ``name`` has no released weights, the cache cannot be used safely, the file is not
            cached while offline, or the download fails or does not match its digest.
    """
    entry = release(name)
    root = cache_dir()
    offline = _offline() if offline is None else offline
    try:
        if offline and not root.is_dir():
            raise _not_cached(name, root, entry)
        with CacheDir(root) as cache:
            if _usable(cache, entry, offline, progress):
                return root / entry.filename
            if offline:
                raise _not_cached(name, root, entry)
            return _download(pretrained_url(name), cache, entry, timeout, progress)
    except CacheError as e:
        raise DownloadError(str(e)) from None


def _not_cached(name: str, root: Path, entry: Release) -> DownloadError:
    return DownloadError(f"{name}: not in the cache {root} and offline (IRPE_OFFLINE); copy {entry.filename} "
                         "there or allow network access")


def _recorded(cache: CacheDir, file: str) -> str | None:
    """The digest recorded in ``<file>.sha256`` by an earlier download, if any."""
    words = (cache.read_text(file + RECORD) or "").split()
    return words[0] if words and len(words[0]) == 64 else None


def _usable(cache: CacheDir, entry: Release, offline: bool, progress: bool) -> bool:
    """Whether the cached file can be used as it is (a wrong one is removed)."""
    file = entry.filename
    if not cache.is_file(file):
        return False
    got, want = cache.sha256(file), entry.sha256 or _recorded(cache, file)
    if want:
        if got == want:
            return True
        cache.unlink(file)  # corrupt or replaced: fetch it again (or fail when offline)
        _say(f"{cache.root / file}: sha256 {got[:12]}... differs from {want[:12]}...; removed, fetching again",
             progress)
        return False
    unpinned = cache.read_text(file + UNPINNED)
    if unpinned is None:  # placed there by hand: trusted from its first use on
        cache.write_text(file + RECORD, f"{got}  {file}\n")
        return True
    if offline:
        _say(f"{cache.root / file}: not pinned ({unpinned.split(' ', 1)[-1].strip()}); offline: used as it is", True)
        return True
    return False  # downloaded again: pinned when that download arrives whole or matches this copy


def _download(url: str, cache: CacheDir, entry: Release, timeout: float, progress: bool) -> Path:
    """Fetch into ``<file>.part``, check the digest, rename it to ``<file>``; pin it when that is sound."""
    file, part = entry.filename, entry.filename + ".part"
    why_not_whole = _fetch(url, cache, part, timeout, progress)
    got, want = cache.sha256(part), entry.sha256 or _recorded(cache, file)
    if want and got != want:
        cache.unlink(part)
        cache.unlink(part + META)
        raise DownloadError(f"{url}: sha256 {got} differs from the expected {want}; the download was removed "
                            "(a corrupt or replaced file: try again, or check IRPE_MODEL_MIRROR)")
    earlier = (cache.read_text(file + UNPINNED) or "").split(" ", 1)[0]
    cache.replace(part, file)
    cache.unlink(part + META)
    if want or not why_not_whole or got == earlier:  # checked, or whole, or two downloads agree
        if not want:
            cache.write_text(file + RECORD, f"{got}  {file}\n")
        cache.unlink(file + UNPINNED)
    else:
        cache.write_text(file + UNPINNED, f"{got}  {why_not_whole}\n")
        _say(f"{cache.root / file}: not pinned: {why_not_whole}; used this once and downloaded again on its next "
             "use (pinned when a download arrives whole in one response, or matches this one)", True)
    return cache.root / file


class _Restart(Exception):
    """A 206 that does not continue the saved state: the download starts again from byte 0."""


def _fetch(url: str, cache: CacheDir, part: str, timeout: float, progress: bool, resume: bool = True) -> str:
    """Download ``url`` into ``part``, resuming a matching earlier attempt; returns "" when the body came whole
    in one response with a length, else why it did not. DownloadError on any failure (``part`` is kept)."""
    state = _resume_state(cache, part, url) if resume else None
    headers = {"User-Agent": "irpe-deploy"}
    if state:
        headers.update({"Range": f"bytes={state['have']}-", "If-Range": state["validator"]})
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
            have, total, pieces = _accepted(resp, state)
            cache.write_text(part + META, json.dumps({"url": url, "validator": _validator(resp), "total": total,
                                                      "pieces": pieces}))
            with cache.open(part, os.O_WRONLY | os.O_APPEND) if have else cache.create(part) as f:
                f.truncate(have)
                _copy(resp, f, have, total, part, progress)
    except _Restart:
        cache.unlink(part)
        cache.unlink(part + META)
        return _fetch(url, cache, part, timeout, progress, resume=False)
    except CacheError:
        raise
    except urllib.error.HTTPError as e:
        if e.code == 416 and state:  # our range starts at or past the end: the .part is stale; start over
            cache.unlink(part)
            return _fetch(url, cache, part, timeout, progress, resume=False)
        raise DownloadError(f"{url}: HTTP {e.code} {e.reason}; check the name"
                            + (" and IRPE_MODEL_MIRROR" if os.environ.get("IRPE_MODEL_MIRROR") else "")) from None
    except urllib.error.URLError as e:
        raise DownloadError(f"{url}: cannot connect ({e.reason}); check the network, set IRPE_MODEL_MIRROR to "
                            f"an internal mirror, or place the file in {cache.root}") from None
    except (OSError, ValueError, http.client.HTTPException) as e:  # timeouts, resets, short bodies
        raise DownloadError(f"{url}: download interrupted after {cache.size(part)} bytes "
                            f"({e or type(e).__name__}); run again to resume") from None
    if pieces > 1:
        return f"the body came in {pieces} responses (a resumed download)"
    return "" if total is not None else "the server sent no Content-Length, so a body cut short looks complete"


def _resume_state(cache: CacheDir, part: str, url: str) -> dict[str, Any] | None:
    """The saved state of an earlier attempt that can be resumed: same URL, a validator, a total length."""
    have = cache.size(part)
    if not have:
        return None
    try:
        meta = json.loads(cache.read_text(part + META) or "{}")
    except json.JSONDecodeError:
        return None
    ok = isinstance(meta, dict) and meta.get("url") == url and isinstance(meta.get("validator"), str) and \
        isinstance(meta.get("total"), int) and isinstance(meta.get("pieces"), int) and 0 < have < meta["total"]
    return {**meta, "have": have} if ok else None


def _validator(resp: Any) -> str | None:
    """The response's strong ETag, else its Last-Modified (a weak ETag cannot validate a byte range)."""
    etag = resp.headers.get("ETag")
    return etag if etag and not etag.startswith("W/") else resp.headers.get("Last-Modified")


def _accepted(resp: Any, state: dict[str, Any] | None) -> tuple[int, int | None, int]:
    """(bytes kept from the earlier attempt, total length or None, responses the file is made of).

    A 206 continues the earlier attempt only when its Content-Range starts where that stopped and ends at the
    same total, and its validator is the one saved (a mirror that ignores If-Range would otherwise splice
    two versions of the file); otherwise the download restarts from byte 0 (:class:`_Restart`)."""
    if resp.status != 206:
        length = resp.headers.get("Content-Length")
        return 0, int(length) if length and length.isdigit() else None, 1
    if state is None:
        raise http.client.HTTPException("a 206 partial answer to a request without Range")
    unit, _, spec = (resp.headers.get("Content-Range") or "").partition(" ")
    span, _, size = spec.partition("/")
    first, _, last = span.partition("-")
    if unit != "bytes" or not (first.isdigit() and last.isdigit() and size.isdigit()) or \
            (int(first), int(last), int(size)) != (state["have"], state["total"] - 1, state["total"]) or \
            _validator(resp) != state["validator"]:
        raise _Restart
    return state["have"], state["total"], state["pieces"] + 1


def _copy(resp: BinaryIO, f: BinaryIO, have: int, total: int | None, label: str, progress: bool) -> None:
    """Stream the body into ``f`` with a progress bar; ValueError when it ends before ``total``."""
    bar = _progress_bar(total, have, label, progress)
    done = have
    try:
        while chunk := resp.read(CHUNK):
            f.write(chunk)
            done += len(chunk)
            bar.update(len(chunk))
    finally:
        bar.close()
    if total is not None and done < total:
        raise ValueError(f"the body ended at {done} of {total} bytes")


class _Bar:
    """A minimal progress line for when tqdm is not installed."""

    def __init__(self, total: int | None, initial: int, label: str) -> None:
        self.total, self.done, self.label, self.shown = total, initial, label, -1

    def update(self, n: int) -> None:
        self.done += n
        pct = int(100 * self.done / self.total) if self.total else -1
        if pct != self.shown and pct % 5 == 0:
            self.shown = pct
            print(f"\r{self.label}: {pct}% of {self.total / 1e6:.1f} MB", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.shown >= 0:
            print(file=sys.stderr)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int | None, initial: int, label: str, enabled: bool) -> Any:
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _Bar(total, initial, label)
    return tqdm(total=total, initial=initial, unit="B", unit_scale=True, unit_divisor=1024, desc=label,
                file=sys.stderr, dynamic_ncols=True)


def _say(text: str, enabled: bool) -> None:
    if enabled:
        print(f"irpe: {text}", file=sys.stderr, flush=True)
