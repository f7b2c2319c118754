"""Published-weights downloads against a misbehaving mirror and a hostile cache: a real HTTP
mirror on 127.0.0.1 (tests/models/test_pretrained.py) serving arbitrary bytes (the download never parses them)."""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from irpe.models import pretrained as pt
from tests.models.test_pretrained import FILE, NAME, Zoo, _cache_files, _mirror

SIZE = 1_048_576


def _data(seed: int) -> bytes:
    return random.Random(seed).randbytes(SIZE)


def _pinned(tmp_path: Path) -> str | None:
    record = tmp_path / "cache" / f"{FILE}.sha256"
    return record.read_text().split()[0] if record.exists() else None


@pytest.fixture
def mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Zoo]:
    with _mirror(Zoo(files={FILE: _data(1)}), tmp_path, monkeypatch) as state:
        yield state


def test_a_206_of_another_version_restarts_the_download_from_zero(mirror: Zoo, tmp_path: Path) -> None:
    """(a) The mirror honours Range but ignores If-Range, and the file changed between two attempts."""
    v1, v2 = mirror.files[FILE], _data(2)
    mirror.ignore_if_range, mirror.cut_next_at = True, 300_000
    with pytest.raises(pt.DownloadError, match="interrupted after 300000 bytes"):
        pt.download_pretrained(NAME, progress=False)
    mirror.files[FILE] = v2
    path = pt.download_pretrained(NAME, progress=False)
    assert mirror.ranges == [None, "bytes=300000-", None]  # its 206 had v2's ETag: dropped, fetched from byte 0
    assert path.read_bytes() == v2 != v1[:300_000] + v2[300_000:]
    assert _pinned(tmp_path) == hashlib.sha256(v2).hexdigest()
    assert _cache_files(tmp_path) == [FILE, f"{FILE}.sha256"]


def test_a_206_with_another_total_length_restarts_too(mirror: Zoo, tmp_path: Path) -> None:
    mirror.ignore_if_range, mirror.cut_next_at, mirror.etag = True, 300_000, '"fixed"'
    with pytest.raises(pt.DownloadError, match="interrupted"):
        pt.download_pretrained(NAME, progress=False)
    mirror.files[FILE] = _data(2) + b"longer"  # same ETag (a lying mirror), another length
    assert pt.download_pretrained(NAME, progress=False).read_bytes() == mirror.files[FILE]
    assert mirror.ranges == [None, "bytes=300000-", None]
    assert _pinned(tmp_path) == hashlib.sha256(mirror.files[FILE]).hexdigest()


def test_a_body_assembled_from_two_responses_is_never_pinned(mirror: Zoo, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A mirror whose ETag does not change with the file: the splice cannot be seen, so it is used once,
    not pinned, and downloaded again (whole) on the next use."""
    v1, v2 = mirror.files[FILE], _data(2)
    mirror.ignore_if_range, mirror.cut_next_at, mirror.etag = True, 300_000, '"fixed"'
    with pytest.raises(pt.DownloadError, match="interrupted"):
        pt.download_pretrained(NAME, progress=False)
    mirror.files[FILE] = v2
    capsys.readouterr()
    path = pt.download_pretrained(NAME, progress=False)
    assert path.read_bytes() == v1[:300_000] + v2[300_000:]
    assert _pinned(tmp_path) is None and _cache_files(tmp_path) == [FILE, f"{FILE}.unpinned"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not pinned: the body came in 2 responses" in err, err
    assert pt.download_pretrained(NAME, progress=False).read_bytes() == v2
    assert mirror.ranges == [None, "bytes=300000-", None]
    assert _pinned(tmp_path) == hashlib.sha256(v2).hexdigest() and _cache_files(tmp_path) == [FILE, f"{FILE}.sha256"]


def test_a_body_without_content_length_is_never_pinned(mirror: Zoo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """(b) A 200 with no Content-Length, closed after 400,000 of 1,048,576 bytes, looks complete."""
    full = mirror.files[FILE]
    mirror.no_length, mirror.cut_next_at = True, 400_000
    capsys.readouterr()
    path = pt.download_pretrained(NAME, progress=False)
    assert path.stat().st_size == 400_000 and _pinned(tmp_path) is None  # used once, not trusted
    assert "not pinned: the server sent no Content-Length" in capsys.readouterr().err
    monkeypatch.setenv("IRPE_OFFLINE", "1")
    assert pt.download_pretrained(NAME, progress=False) == path and _pinned(tmp_path) is None
    assert "offline: used as it is" in capsys.readouterr().err
    monkeypatch.delenv("IRPE_OFFLINE")
    assert pt.download_pretrained(NAME, progress=False).read_bytes() == full  # again, whole but length unknown:
    assert _pinned(tmp_path) is None  # it differs from the first copy, so still not pinned
    assert pt.download_pretrained(NAME, progress=False).read_bytes() == full
    assert _pinned(tmp_path) == hashlib.sha256(full).hexdigest()  # two downloads agree: pinned
    assert len(mirror.paths) == 3 and _cache_files(tmp_path) == [FILE, f"{FILE}.sha256"]
    assert pt.download_pretrained(NAME, progress=False) == path and len(mirror.paths) == 3


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o755 | 0o020])
def test_a_cache_writable_by_others_is_refused(mirror: Zoo, tmp_path: Path, mode: int) -> None:
    """(c) A shared IRPE_CACHE where someone planted <file>.part as a link to a victim file."""
    root, victim = tmp_path / "cache", tmp_path / "victim"
    root.mkdir()
    root.chmod(mode)
    victim.write_bytes(b"precious")
    (root / f"{FILE}.part").symlink_to(victim)
    with pytest.raises(pt.DownloadError) as e:
        pt.download_pretrained(NAME, progress=False)
    msg = str(e.value)
    assert f"cache directory {root} is writable by group or others (mode {mode:o})" in msg, msg
    assert f"chmod go-w {root}" in msg and "\n" not in msg
    assert victim.read_bytes() == b"precious" and mirror.paths == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the directory to another uid")
def test_a_cache_owned_by_another_user_is_refused(mirror: Zoo, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir(mode=0o755)
    os.chown(root, 12345, 12345)
    with pytest.raises(pt.DownloadError, match=f"cache directory {root} belongs to uid 12345, not you"):
        pt.download_pretrained(NAME, progress=False)


@pytest.mark.parametrize("suffix", [".part", ".part.json", ".sha256.tmp", ".sha256", ""])
def test_links_in_the_cache_are_never_followed(mirror: Zoo, tmp_path: Path, suffix: str) -> None:
    """(c) Links planted in a private cache (before its mode was tightened, say): nothing is written through
    them; where the cache would read one (the file, its .part or .sha256) the download is refused."""
    root, victim = tmp_path / "cache", tmp_path / "victim"
    root.mkdir(mode=0o700)
    victim.write_bytes(b"precious")
    (root / f"{FILE}{suffix}").symlink_to(victim)
    if suffix in (".part", ".sha256", ""):
        with pytest.raises(pt.DownloadError, match=f"{FILE}{suffix}: a symbolic link .* remove it"):
            pt.download_pretrained(NAME, progress=False)
    else:  # written under fresh names and renamed over: the link is replaced or ignored
        assert pt.download_pretrained(NAME, progress=False).read_bytes() == mirror.files[FILE]
        assert _pinned(tmp_path) == hashlib.sha256(mirror.files[FILE]).hexdigest()
    assert victim.read_bytes() == b"precious"
