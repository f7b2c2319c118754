"""Client system shared memory registry (server/pipeline/sysshm.py): off by default, keys confined to one name
in /dev/shm, regions bounded in number and size, reads and writes never leave the registered bytes."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from irpe.server.config import Settings
from irpe.server.errors import APIError
from irpe.server.pipeline.sysshm import SharedMemoryRegistry

ME = os.getuid()  # the owner of the segments these tests create

shm = pytest.importorskip("tritonclient.utils.shared_memory", reason="tritonclient is in the dev extra")


@pytest.fixture
def key() -> Iterator[str]:
    """A 4096-byte client region in /dev/shm made by tritonclient; removed afterwards."""
    name = f"/i30t_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("t", name, 4096)
    shm.set_shared_memory_region(handle, [np.arange(1024, dtype=np.float32)])
    yield name
    shm.destroy_shared_memory_region(handle)


def _status(e: pytest.ExceptionInfo[APIError]) -> int:
    return e.value.status


def test_off_by_default(key: str) -> None:
    reg = SharedMemoryRegistry()
    with pytest.raises(APIError) as e:
        reg.register("r", key, 0, 64, owner=ME)
    assert _status(e) == 403 and "--allow-client-shm" in e.value.message
    assert reg.status(owner=ME) == []
    assert Settings().allow_client_shm is False


def test_register_read_write_status(key: str) -> None:
    reg = SharedMemoryRegistry(True)
    reg.register("r", key, 64, 128, owner=ME)
    assert reg.status(owner=ME) == [{"name": "r", "key": key, "offset": 64, "byte_size": 128}]
    assert reg.status("r", owner=ME) == reg.status(owner=ME)
    got = reg.owned_by(ME).read_array("r", 0, 128, "<f4", [2, 16])
    np.testing.assert_array_equal(got.reshape(-1), np.arange(16, 48, dtype=np.float32))
    reg.write("r", 8, np.float32([7.5, -1]).tobytes(), owner=ME)
    raw = Path("/dev/shm", key.lstrip("/")).read_bytes()
    assert np.frombuffer(raw[72:80], "<f4").tolist() == [7.5, -1.0]
    assert np.frombuffer(raw[64:72], "<f4").tolist() == [16.0, 17.0]  # nothing else written
    reg.unregister("r", owner=ME)
    reg.unregister("never-registered", owner=ME)  # no error, as in Triton
    assert reg.status(owner=ME) == []


def test_outside_the_region_is_refused(key: str) -> None:
    reg = SharedMemoryRegistry(True)
    reg.register("r", key, 1024, 256, owner=ME)
    for offset, size in ((0, 257), (256, 1), (-4, 8), (200, 64), (2**62, 8)):
        with pytest.raises(APIError) as e:
            reg.read("r", offset, size, owner=ME)
        assert _status(e) == 400 and "outside shared memory region 'r'" in e.value.message
        with pytest.raises(APIError):
            reg.write("r", offset, b"\0" * max(size, 0) if size < 1024 else b"\0", owner=ME)
    assert reg.read("r", 252, 4, owner=ME) == bytearray(np.float32([256 + 63]).tobytes())
    with pytest.raises(APIError) as e:
        reg.owned_by(ME).read_array("r", 0, 12, "<f4", [2, 2])
    assert _status(e) == 400 and "16 bytes" in e.value.message


def test_unknown_region_is_404(key: str) -> None:
    reg = SharedMemoryRegistry(True)
    for call in (lambda: reg.status("nope", owner=ME), lambda: reg.read("nope", 0, 4, owner=ME),
                 lambda: reg.write("nope", 0, b"x", owner=ME)):
        with pytest.raises(APIError) as e:
            call()
        assert _status(e) == 404 and "'nope'" in e.value.message


@pytest.mark.parametrize("bad_key", ["/../etc/passwd", "/a/b", "/.hidden", "", "/" + "x" * 300, "/psm_1234",
                                     "/irpe-slots", "/triton_python_backend_shm_region_1", 5])
def test_keys_are_confined(bad_key: object) -> None:
    reg = SharedMemoryRegistry(True)
    with pytest.raises(APIError) as e:
        reg.register("r", bad_key, 0, 8, owner=ME)  # type: ignore[arg-type]
    assert _status(e) == 400 and "key" in e.value.message
    assert reg.status(owner=ME) == []


def test_links_and_non_files_are_refused(tmp_path: Path, key: str) -> None:
    link = f"i30t_link_{uuid.uuid4().hex[:8]}"
    os.symlink("/etc/hostname", f"/dev/shm/{link}")
    try:
        reg = SharedMemoryRegistry(True)
        with pytest.raises(APIError) as e:
            reg.register("r", "/" + link, 0, 4, owner=ME)
        assert _status(e) == 400 and "unable to open" in e.value.message
        with pytest.raises(APIError) as e:
            reg.register("r", "/missing_" + link, 0, 4, owner=ME)
        assert _status(e) == 400
    finally:
        os.unlink(f"/dev/shm/{link}")


def test_bounds_on_number_size_and_names(key: str) -> None:
    reg = SharedMemoryRegistry(True, max_regions=2, max_bytes=1024)
    with pytest.raises(APIError) as e:
        reg.register("big", key, 0, 2048, owner=ME)
    assert _status(e) == 400 and "1..1024" in e.value.message
    with pytest.raises(APIError) as e:
        reg.register("past-end", key, 4000, 200, owner=ME)  # inside the size limit, but beyond the 4096-byte file
    assert _status(e) == 400 and "exceeds the 4096 bytes" in e.value.message
    for bad in ("", "a/b", "../x", "x" * 200, None):
        with pytest.raises(APIError):
            reg.register(bad, key, 0, 8, owner=ME)  # type: ignore[arg-type]
    for what in ((-1, 8), (0, 0), (0, True), ("0", 8)):
        with pytest.raises(APIError):
            reg.register("w", key, *what, owner=ME)  # type: ignore[arg-type]
    reg.register("a", key, 0, 8, owner=ME)
    with pytest.raises(APIError) as e:
        reg.register("a", key, 0, 8, owner=ME)
    assert "already in manager" in e.value.message
    reg.register("b", key, 8, 8, owner=ME)
    with pytest.raises(APIError) as e:
        reg.register("c", key, 16, 8, owner=ME)
    assert "already 2 shared memory regions" in e.value.message
    reg.unregister(owner=ME)
    assert reg.status(owner=ME) == []
    reg.register("c", key, 16, 8, owner=ME)
    reg.close()


def test_a_shrunk_file_is_a_clear_error_not_a_crash(key: str) -> None:
    reg = SharedMemoryRegistry(True)
    reg.register("r", key, 0, 4096, owner=ME)
    os.truncate(f"/dev/shm/{key.lstrip('/')}", 100)
    with pytest.raises(APIError) as e:
        reg.read("r", 0, 4096, owner=ME)
    assert _status(e) == 400 and "shrank" in e.value.message
    assert len(reg.read("r", 0, 100, owner=ME)) == 100
    reg.close()


def test_settings_keep_regions_in_one_process() -> None:
    with pytest.raises(ValueError, match="allow_client_shm"):
        Settings(allow_client_shm=True, frontends=2).validate()
    assert Settings(allow_client_shm=True, device="cuda").resolved_frontends() == 1
    assert Settings.from_env({"IRPE_ALLOW_CLIENT_SHM": "1"}).allow_client_shm is True


def test_regions_are_their_owners(key: str) -> None:
    """Each uid registers only files it owns (or under the operator's prefix) and sees and removes only its own
    regions; --max-shm-regions counts per uid."""
    other = ME + 1
    reg = SharedMemoryRegistry(True, max_regions=1)
    reg.register("r", key, 0, 64, owner=ME)
    with pytest.raises(APIError) as e:
        reg.register("r", key, 0, 64, owner=other)  # not its file
    assert _status(e) == 403 and f"owned by uid {ME}, not by uid {other}" in e.value.message
    assert reg.status(owner=other) == []
    for call in (lambda: reg.status("r", owner=other), lambda: reg.read("r", 0, 4, owner=other),
                 lambda: reg.write("r", 0, b"x", owner=other), lambda: reg.check("r", 0, 4, owner=other)):
        with pytest.raises(APIError) as e:
            call()
        assert _status(e) == 404
    reg.unregister("r", owner=other)
    reg.unregister(owner=other)
    assert [r["name"] for r in reg.status(owner=ME)] == ["r"]
    shared = SharedMemoryRegistry(True, max_regions=1, name_prefix=key[1:6])
    shared.register("r", key, 0, 64, owner=ME)
    shared.register("r", key, 64, 64, owner=other)  # its own name space, its own count
    assert shared.status("r", owner=other) == [{"name": "r", "key": key, "offset": 64, "byte_size": 64}]
    shared.unregister(owner=other)
    assert [r["offset"] for r in shared.status(owner=ME)] == [0]
    reg.close()
    shared.close()


def test_a_region_unregistered_during_a_read_is_never_another_file(key: str, tmp_path: Path) -> None:
    """Reads use a duplicate of the descriptor, so closing the region's own one cannot redirect them."""
    reg = SharedMemoryRegistry(True)
    reg.register("r", key, 0, 4096, owner=ME)
    fd, pos, _ = reg._hold(ME, "r", 0, 8)
    reg.unregister("r", owner=ME)
    reused = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT)  # may take the number the region had
    try:
        assert os.pread(fd, 8, pos) == np.arange(2, dtype=np.float32).tobytes()
    finally:
        os.close(fd)
        os.close(reused)
