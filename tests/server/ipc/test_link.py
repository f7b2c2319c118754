"""The front end's link to the engine process (``--frontends``), against a real Unix socket that reads its frames."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import numpy as np
import pytest

from irpe.server.ipc import wire
from irpe.server.ipc.link import EngineGoneError, EngineLink


def _request(conn: socket.socket) -> dict:
    """The first image request the engine end receives (after the hello and the slot pool's attach)."""
    while (frame := wire.recv_frame(conn)) is not None:
        if "id" in frame[0]:
            return frame[0]
    raise AssertionError("the link hung up before sending a request")


@pytest.mark.parametrize("left", [0.25, None])
def test_a_request_carries_what_is_left_of_its_deadline(tmp_path: Path, left: float | None) -> None:
    """The engine enforces the deadline (504): it must get the time left after the front end's own work (decode,
    queueing), not a fresh ``--timeout-s``; with no deadline given, the whole ``--timeout-s``."""
    path = str(tmp_path / "engine.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    link = EngineLink(path, slots=2, timeout_s=30.0)
    link.connect(timeout=5)
    conn, _ = listener.accept()
    batcher = link.batcher("m", 1, crop=8, max_queue=4)

    async def submit() -> dict:
        task = asyncio.ensure_future(batcher.submit([np.zeros((3, 8, 8), np.float32)], timeout=left))
        head = await asyncio.to_thread(_request, conn)
        conn.close()  # the engine goes away: the waiting request fails, nothing hangs
        with pytest.raises(EngineGoneError):
            await asyncio.wait_for(task, 5)
        return head

    try:
        head = asyncio.run(submit())
        assert head["timeout"] == (30.0 if left is None else left)
        assert link.gone
    finally:
        listener.close()
        link.stop(drain=False, timeout=1)
