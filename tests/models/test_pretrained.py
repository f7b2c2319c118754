"""Published checkpoints by name, against a real HTTP server on 127.0.0.1 serving an official-format file."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from irpe.cli import main
from irpe.models import create_model, load_checkpoint
from irpe.models import pretrained as pt

NAME = "deit_tiny_patch16_224_ctx_product_50_shared_k"
FILE = f"{NAME}.pth"


@dataclass
class Zoo:
    """What the test server serves, how it misbehaves, and what it saw."""

    files: dict[str, bytes]
    truncate_next: int = 0  # requests whose body stops halfway (Content-Length still says the full size)
    cut_next_at: int = 0  # the next body stops after this many bytes (then the connection closes)
    ignore_if_range: bool = False  # answer every Range with 206, whatever If-Range says
    etag: str | None = None  # a fixed ETag for every version of the file (None: one per content)
    no_length: bool = False  # no Content-Length: the body ends when the connection closes
    ranges: list[str | None] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    url: str = ""


def _handler(zoo: Zoo) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            zoo.paths.append(self.path)
            zoo.ranges.append(self.headers.get("Range"))
            body = zoo.files.get(self.path.rsplit("/", 1)[-1])
            if body is None:
                self.send_error(404, "Not Found")
                return
            etag = zoo.etag or '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
            start, status = 0, 200
            rng = self.headers.get("Range")
            if rng and (zoo.ignore_if_range or self.headers.get("If-Range", etag) == etag):
                start = int(rng.removeprefix("bytes=").split("-")[0])
                if start >= len(body):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(body)}")
                    self.end_headers()
                    return
                status = 206
            self.send_response(status)
            if not zoo.no_length:
                self.send_header("Content-Length", str(len(body) - start))
            self.send_header("ETag", etag)
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            self.end_headers()
            payload = body[start:]
            if zoo.truncate_next:
                zoo.truncate_next -= 1
                payload = payload[: len(payload) // 2]
                self.close_connection = True
            if zoo.cut_next_at:
                payload, zoo.cut_next_at = payload[: zoo.cut_next_at], 0
                self.close_connection = True
            self.wfile.write(payload)

    return Handler


@pytest.fixture(scope="module")
def checkpoint_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The tiny published variant in the official format: {'model', 'epoch', 'args'} (random weights)."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("zoo") / FILE
    torch.save({"model": create_model(NAME).state_dict(), "epoch": 299,
                "args": argparse.Namespace(model=NAME, input_size=224)}, path)
    return path.read_bytes()


@contextlib.contextmanager
def _mirror(state: Zoo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Zoo]:
    """A real HTTP mirror on 127.0.0.1 serving ``state``; IRPE_MODEL_MIRROR and IRPE_CACHE point at it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/releases/1.0/"
    monkeypatch.setenv("IRPE_MODEL_MIRROR", state.url)
    monkeypatch.setenv("IRPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("IRPE_OFFLINE", raising=False)
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def zoo(checkpoint_bytes: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Zoo]:
    with _mirror(Zoo(files={FILE: checkpoint_bytes}), tmp_path, monkeypatch) as state:
        yield state


def _cache_files(tmp_path: Path) -> list[str]:
    root = tmp_path / "cache"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def test_downloads_from_the_mirror_records_the_digest_and_loads(zoo: Zoo, tmp_path: Path) -> None:
    path = pt.download_pretrained(NAME, progress=False)
    assert path == tmp_path / "cache" / FILE and path.read_bytes() == zoo.files[FILE]
    digest = hashlib.sha256(zoo.files[FILE]).hexdigest()
    assert (tmp_path / "cache" / f"{FILE}.sha256").read_text().split()[0] == digest
    assert _cache_files(tmp_path) == [FILE, f"{FILE}.sha256"]
    assert zoo.paths == [f"/releases/1.0/{FILE}"] and zoo.ranges == [None]
    model = load_checkpoint(path)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in create_model(NAME).parameters())
    assert pt.download_pretrained(NAME, progress=False) == path and len(zoo.paths) == 1  # cached


def test_truncated_body_keeps_only_the_part_file_and_resumes_with_a_range(zoo: Zoo, tmp_path: Path) -> None:
    zoo.truncate_next = 1
    with pytest.raises(pt.DownloadError, match="interrupted after .* run again to resume"):
        pt.download_pretrained(NAME, progress=False)
    assert FILE not in _cache_files(tmp_path)
    part = tmp_path / "cache" / f"{FILE}.part"
    half = part.stat().st_size
    assert 0 < half < len(zoo.files[FILE])
    path = pt.download_pretrained(NAME, progress=False)
    assert zoo.ranges == [None, f"bytes={half}-"]
    assert path.read_bytes() == zoo.files[FILE]
    assert _cache_files(tmp_path) == [FILE, f"{FILE}.unpinned"]  # made of two responses: not pinned
    assert pt.download_pretrained(NAME, progress=False).read_bytes() == zoo.files[FILE]
    assert zoo.ranges == [None, f"bytes={half}-", None]  # downloaded again, whole: pinned
    assert _cache_files(tmp_path) == [FILE, f"{FILE}.sha256"]


def test_wrong_pinned_digest_is_refused_and_nothing_is_left(zoo: Zoo, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(pt.PUBLISHED, NAME, pt.Release(FILE, sha256="0" * 64))
    with pytest.raises(pt.DownloadError, match="sha256 .* differs from the expected 0{64}; the download was removed"):
        pt.download_pretrained(NAME, progress=False)
    assert _cache_files(tmp_path) == []


def test_matching_pinned_digest_is_accepted(zoo: Zoo, monkeypatch: pytest.MonkeyPatch) -> None:
    digest = hashlib.sha256(zoo.files[FILE]).hexdigest()
    monkeypatch.setitem(pt.PUBLISHED, NAME, pt.Release(FILE, sha256=digest))
    assert pt.download_pretrained(NAME, progress=False).read_bytes() == zoo.files[FILE]


def test_corrupted_cache_file_is_fetched_again(zoo: Zoo, tmp_path: Path) -> None:
    path = pt.download_pretrained(NAME, progress=False)
    path.write_bytes(b"garbage" + zoo.files[FILE][7:])
    assert pt.download_pretrained(NAME, progress=False).read_bytes() == zoo.files[FILE]
    assert len(zoo.paths) == 2


def test_404_is_one_clear_error(zoo: Zoo, tmp_path: Path) -> None:
    zoo.files.clear()
    with pytest.raises(pt.DownloadError, match=r"HTTP 404 .*IRPE_MODEL_MIRROR"):
        pt.download_pretrained(NAME, progress=False)
    assert _cache_files(tmp_path) == []


def test_offline_uses_the_cache_and_names_the_fix_when_missing(zoo: Zoo, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IRPE_OFFLINE", "1")
    with pytest.raises(pt.DownloadError, match="not in the cache .* offline"):
        pt.download_pretrained(NAME, progress=False)
    assert zoo.paths == []
    monkeypatch.delenv("IRPE_OFFLINE")
    path = pt.download_pretrained(NAME, progress=False)
    monkeypatch.setenv("IRPE_OFFLINE", "1")
    assert pt.download_pretrained(NAME, progress=False) == path and len(zoo.paths) == 1


def test_no_network_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("IRPE_MODEL_MIRROR", f"http://127.0.0.1:{port}/zoo")
    monkeypatch.setenv("IRPE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(pt.DownloadError, match="cannot connect .* IRPE_MODEL_MIRROR"):
        pt.download_pretrained(NAME, progress=False)


def test_unpublished_name_lists_the_published_ones() -> None:
    with pytest.raises(pt.DownloadError, match="no released weights; published: deit_tiny"):
        pt.download_pretrained("deit_small_patch16_224_ctx_euc_20_shared_k")
    assert pt.pretrained_url(NAME).endswith(f"/{FILE}")


def test_default_url_is_the_authors_release(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IRPE_MODEL_MIRROR", raising=False)
    assert pt.pretrained_url(NAME) == f"https://github.com/wkcn/iRPE-model-zoo/releases/download/1.0/{FILE}"


def test_cli_export_by_name_and_cli_errors(zoo: Zoo, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "artifact"
    assert main(["export", NAME, "--pretrained", "-o", str(out)]) == 0
    assert (out / "model.json").is_file() and (out / "model.onnx").is_file()
    from PIL import Image

    Image.new("RGB", (64, 48), (200, 30, 30)).save(tmp_path / "red.png")
    capsys.readouterr()
    assert main(["classify", str(tmp_path / "red.png"), "--model", NAME, "--pretrained", "--top-k", "1"]) == 0
    assert f"model: {NAME}" in capsys.readouterr().out and len(zoo.paths) == 1  # from the cache
    zoo.files.clear()
    (tmp_path / "cache" / FILE).unlink()
    capsys.readouterr()
    assert main(["export", NAME, "--pretrained", "-o", str(tmp_path / "again")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("irpe export: error: ") and "HTTP 404" in err, err
