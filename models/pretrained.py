"""Published iRPE checkpoints by name: the authors' release files, downloaded once into a cache.

``download_pretrained(name)`` returns the cached file, fetching it when needed:

- source: the authors' model zoo (``RELEASE_URL`` + ``<name>.pth``, linked from microsoft/Cream's
  iRPE README), or ``$IRPE_MODEL_MIRROR/<name>.pth`` (an internal mirror: same file names);
- cache: ``$IRPE_CACHE``, else ``~/.cache/irpe/checkpoints``; a download goes to ``<file>.part`` (with
  a progress bar on stderr), resumes from there with an HTTP Range request (``If-Range`` on the
  validator the server gave), and is renamed atomically to ``<file>`` only after its sha256 checks out;
- digests: pinned in ``PUBLISHED`` where known (the zoo publishes none today), otherwise recorded in
  ``<file>.sha256`` on the first download and checked on every later use;
- offline (``IRPE_OFFLINE=1`` or ``offline=True``): only the cache is used.

Every failure raises :class:`DownloadError` with one line saying what happened and what to do; nothing
but ``*.part`` (the resume state) is ever left behind for an incomplete or wrong file.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

RELEASE_URL = "https://github.com/wkcn/iRPE-model-zoo/releases/download/1.0/"
CHUNK = 1 << 16


@dataclass(frozen=True)
class Release:
    """One published checkpoint: its file name in the release and its sha256 when known."""

    filename: str
    sha256: str | None = None


#: The variants with released weights (the other registered variants have none).
PUBLISHED: dict[str, Release] = {name: Release(f"{name}.pth") for name in (
    "deit_tiny_patch16_224_ctx_product_50_shared_k",
    "deit_small_patch16_224_ctx_product_50_shared_k",
    "deit_small_patch16_224_ctx_product_50_shared_qk",
    "deit_small_patch16_224_ctx_product_50_shared_qkv",
    "deit_base_patch16_224_ctx_product_50_shared_k",
    "deit_base_patch16_224_ctx_product_50_shared_qkv",
)}


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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _expected_digest(name: str, target: Path) -> str | None:
    """The pinned digest, else the one recorded at the first download, else None."""
    pinned = release(name).sha256
    record = target.with_name(target.name + ".sha256")
    if pinned:
        return pinned
    return record.read_text().split()[0] if record.is_file() and record.read_text().strip() else None


def download_pretrained(name: str, progress: bool = True, offline: bool | None = None,
                        timeout: float = 30.0) -> Path:
    """The cached checkpoint file of the published variant ``name`` (downloaded when missing)."""
    rel = release(name)
    root = cache_dir()
    target = root / rel.filename
    if target.is_file():
        want = _expected_digest(name, target)
        got = _sha256(target)
        if want is None or got == want:
            if want is None:
                _record(target, got)
            return target
        target.unlink()  # corrupt or replaced: fetch it again (or fail below when offline)
        _say(f"{target}: sha256 {got[:12]}... differs from {want[:12]}...; removed, fetching again", progress)
    offline = _offline() if offline is None else offline
    if offline:
        raise DownloadError(f"{name}: not in the cache {root} and offline (IRPE_OFFLINE); copy {rel.filename} "
                            "there or allow network access")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DownloadError(f"cache directory {root} is not writable ({e.strerror or e}); set IRPE_CACHE") from None
    url = pretrained_url(name)
    part = target.with_name(target.name + ".part")
    _fetch(url, part, timeout, progress)
    got, want = _sha256(part), _expected_digest(name, target)
    if want is not None and got != want:
        part.unlink()
        _meta(part).unlink(missing_ok=True)
        raise DownloadError(f"{url}: sha256 {got} differs from the expected {want}; the download was removed "
                            "(a corrupt or replaced file: try again, or check IRPE_MODEL_MIRROR)")
    os.replace(part, target)
    _meta(part).unlink(missing_ok=True)
    _record(target, got)
    return target


def _record(target: Path, digest: str) -> None:
    record = target.with_name(target.name + ".sha256")
    if not record.is_file():
        tmp = record.with_name(record.name + ".tmp")
        tmp.write_text(f"{digest}  {target.name}\n")
        os.replace(tmp, record)


def _meta(part: Path) -> Path:
    return part.with_name(part.name + ".json")


def _fetch(url: str, part: Path, timeout: float, progress: bool) -> None:
    """Download ``url`` into ``part``, resuming from its current size; DownloadError on any failure."""
    have = part.stat().st_size if part.is_file() else 0
    meta = json.loads(_meta(part).read_text()) if have and _meta(part).is_file() else {}
    headers = {"User-Agent": "irpe-deploy"}
    if have and meta.get("url") == url:
        headers["Range"] = f"bytes={have}-"
        if meta.get("validator"):
            headers["If-Range"] = meta["validator"]
    else:
        have = 0
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
            have = _resume_offset(resp, have)
            total = _total(resp, have)
            validator = resp.headers.get("ETag") or resp.headers.get("Last-Modified")
            _meta(part).write_text(json.dumps({"url": url, "validator": validator}))
            with open(part, "ab" if have else "wb") as f:
                f.truncate(have)
                _copy(resp, f, have, total, part.name, progress)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # our range starts at or past the end: the .part is stale; start over
            part.unlink()
            return _fetch(url, part, timeout, progress)
        raise DownloadError(f"{url}: HTTP {e.code} {e.reason}; check the name"
                            + (" and IRPE_MODEL_MIRROR" if os.environ.get("IRPE_MODEL_MIRROR") else "")) from None
    except urllib.error.URLError as e:
        raise DownloadError(f"{url}: cannot connect ({e.reason}); check the network, set IRPE_MODEL_MIRROR to "
                            f"an internal mirror, or place the file in {part.parent}") from None
    except (OSError, ValueError, http.client.HTTPException) as e:  # timeouts, resets, short bodies
        size = part.stat().st_size if part.is_file() else 0
        raise DownloadError(f"{url}: download interrupted after {size} bytes ({e or type(e).__name__}); "
                            "run again to resume") from None


def _resume_offset(resp: Any, have: int) -> int:
    """Bytes already on disk that this response continues (0 when the server sent the whole file)."""
    if resp.status != 206:
        return 0
    unit, _, spec = (resp.headers.get("Content-Range") or "").partition(" ")
    start = spec.split("-", 1)[0]
    if unit != "bytes" or not start.isdigit() or int(start) != have:
        raise ValueError(f"unexpected Content-Range {resp.headers.get('Content-Range')!r} for a resume at {have}")
    return have


def _total(resp: Any, have: int) -> int | None:
    length = resp.headers.get("Content-Length")
    return have + int(length) if length and length.isdigit() else None


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
