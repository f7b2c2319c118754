"""Shared-memory slots: all-or-none, reuse after release, another process sees the same pixels."""

from __future__ import annotations

import multiprocessing
import socket

import numpy as np

from irpe.server.ipc.slots import SlotPool, attach
from irpe.server.ipc.wire import pack, recv_frame


def _child_sum(desc: dict, slot: int, out: multiprocessing.Queue) -> None:
    shm, array = attach(desc)
    out.put(float(array[slot].sum()))
    del array
    shm.close()


def test_put_is_all_or_none_and_slots_come_back() -> None:
    pool = SlotPool(3, (3, 4, 4))
    try:
        a = pool.put([np.ones((3, 4, 4), np.float32), np.full((3, 4, 4), 2, np.float32)])
        assert a is not None and len(set(a)) == 2 and pool.free == 1
        assert pool.put([np.zeros((3, 4, 4), np.float32)] * 2) is None and pool.free == 1  # nothing taken
        np.testing.assert_array_equal(pool.array[a[1]], 2)
        pool.release(a)
        assert pool.free == 3 and pool.put([np.zeros((3, 4, 4), np.float32)] * 3) is not None
    finally:
        pool.close()


def test_another_process_reads_the_slot_without_pickling_pixels() -> None:
    pool = SlotPool(2, (3, 8, 8))
    try:
        x = np.random.default_rng(0).standard_normal((3, 8, 8)).astype(np.float32)
        (slot,) = pool.put([x])
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        p = ctx.Process(target=_child_sum, args=(pool.describe(), slot, out))
        p.start()
        got = out.get(timeout=60)
        p.join(30)
        assert got == float(x.sum()) and p.exitcode == 0
    finally:
        pool.close()


def test_frames_round_trip_and_eof_is_none() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(pack({"id": 7, "slots": [1, 2]}, b"\x00\x01" * 10))
        head, data = recv_frame(b)  # type: ignore[misc]
        assert head == {"id": 7, "slots": [1, 2]} and data == b"\x00\x01" * 10
        a.close()
        assert recv_frame(b) is None
