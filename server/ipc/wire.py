"""The whole wire format between the front ends and the engine process of ``--frontends``, in one place.

A frame is ``u32 header length, u32 data length, orjson header, raw data`` on a Unix socket. Headers:

front end -> engine
  ``hello``   ``{"op", "pid"}``: the first frame of a link.
  ``attach``  ``{"op", "shm", "slots", "shape", "dtype"}``: a shared-memory slot pool (:mod:`.slots`) the
              following requests name by ``shm``.
  infer       ``{"id", "shm", "slots", "timeout", "model", "version"}``: run the images in those slots on
              that model version; answered by :func:`answer` (per image its ``queue_s``, ``infer_s`` and
              ``batch`` size; the logits' ``classes``) + float32 logits, or an error.
  ``stats``   ``{"op", "rid", "model", "version"}``: that version's Triton statistics.
  ``control`` ``{"op", "rid", "name", "load"}``: a repository load / unload.
  ``ack``     ``{"op", "seq"}``: status ``seq`` is applied (the front end routes accordingly).
engine -> front end
  ``status``  :func:`status_head`: readiness and the route table, pushed on connect and on every change.
  ``reply``   ``{"op", "rid", ...}``: the answer to a ``stats`` or ``control`` frame.

Errors cross as ``{"err": code, "msg", ...}`` (:func:`error_head`) and come back as the same exception
(:func:`raise_error`): this is the one table between the two processes.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

import numpy as np
import orjson

from ..batch_queue import BatcherStoppedError, QueueFullError, Result
from ..errors import APIError

_FRAME = struct.Struct("<II")
HELLO = "hello"
ATTACH = "attach"
STATUS = "status"
ACK = "ack"
STATS = "stats"
CONTROL = "control"
REPLY = "reply"


def pack(header: dict[str, Any], data: bytes = b"") -> bytes:
    """One frame.

    Args:
        header: the frame's header (JSON-serialisable).
        data: the raw data after it.

    Returns:
        The frame's bytes.
    """
    head = orjson.dumps(header)
    return _FRAME.pack(len(head), len(data)) + head + data


def recv_frame(sock: socket.socket) -> tuple[dict[str, Any], bytes] | None:
    """Read one frame from a blocking socket.

    Args:
        sock: the socket.

    Returns:
        The header and the data; None at EOF.
    """
    raw = _recv_exactly(sock, _FRAME.size)
    if raw is None:
        return None
    n_head, n_data = _FRAME.unpack(raw)
    body = _recv_exactly(sock, n_head + n_data)
    if body is None:
        return None
    return orjson.loads(body[:n_head]), body[n_head:]


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


async def read_frame(reader: Any) -> tuple[dict[str, Any], bytes] | None:
    """Read one frame from an asyncio StreamReader.

    Args:
        reader: the stream.

    Returns:
        The header and the data; None at EOF or a broken stream.
    """
    try:
        raw = await reader.readexactly(_FRAME.size)
        n_head, n_data = _FRAME.unpack(raw)
        body = await reader.readexactly(n_head + n_data)
    except (EOFError, OSError):  # IncompleteReadError is an EOFError
        return None
    return orjson.loads(body[:n_head]), body[n_head:]


def answer(request_id: int, results: list[Result]) -> bytes:
    """The frame that answers an infer request.

    Args:
        request_id: the request's ``id``.
        results: one per image, in order.

    Returns:
        The frame: per image its queue and inference seconds and batch size, then float32 logits.
    """
    logits = np.stack([r.logits for r in results]).astype(np.float32, copy=False)
    return pack({"id": request_id, "queue_s": [r.queue_s for r in results], "infer_s": [r.inference_s for r in results],
                 "batch": [r.batch_size for r in results], "classes": int(logits.shape[1])}, logits.tobytes())


def answer_results(head: dict[str, Any], data: bytes) -> list[Result]:
    """The results an :func:`answer` frame carries.

    Args:
        head: the frame's header.
        data: the frame's data (the logits).

    Returns:
        One result per image, in order.

    Raises:
        Exception: the error the frame carries instead (:func:`raise_error`).
    """
    raise_error(head)
    sizes = head["batch"]
    logits = np.frombuffer(data, dtype=np.float32).reshape(len(sizes), head["classes"])
    return [Result(logits[k], head["queue_s"][k], head["infer_s"][k], sizes[k]) for k in range(len(sizes))]


def error_head(e: BaseException) -> dict[str, Any]:
    """The error fields of an answer (engine side).

    Args:
        e: what the request raised.

    Returns:
        The header fields :func:`raise_error` turns back into the same exception.
    """
    if isinstance(e, APIError):
        return {"err": "api", "status": e.status, "code": e.code, "msg": e.message, "headers": e.headers}
    if isinstance(e, QueueFullError):
        return {"err": "queue_full", "msg": str(e), "retry": e.retry_after}
    if isinstance(e, BatcherStoppedError):
        return {"err": "shutting_down", "msg": str(e)}
    if isinstance(e, asyncio.TimeoutError):
        return {"err": "timeout", "msg": "engine deadline passed"}
    return {"err": "internal", "msg": f"{type(e).__name__}: {e}"[:500]}


def raise_error(head: dict[str, Any]) -> None:
    """Raise what :func:`error_head` sent, as the in-process pipeline raises it (front-end side).

    Args:
        head: an answer's header.

    Raises:
        APIError: the client's error (a 504 for the engine's deadline).
        QueueFullError: the engine's queue is full.
        BatcherStoppedError: the engine is shutting down.
        RuntimeError: any other failure in the engine.
    """
    err = head.get("err") or (head.get("status") and "api")
    if not err:
        return
    msg = str(head.get("msg", ""))
    if err == "api":
        raise APIError(int(head["status"]), str(head.get("code", "internal")), msg, head.get("headers") or None)
    if err == "queue_full":
        raise QueueFullError(int(head.get("retry", 1)))
    if err == "shutting_down":
        raise BatcherStoppedError(msg or "server is shutting down")
    if err == "timeout":
        raise APIError(504, "timeout", "request not answered in time by the engine (--timeout-s)")
    raise RuntimeError(f"engine: {msg or err}")


def status_head(ready: bool, failure: str, table: dict[str, Any] | None) -> dict[str, Any]:
    """A status frame's header: readiness, and once warm the route table (:meth:`RemoteHost.apply` reads it:
    ``default``, ``catalog`` {name: [policy, error, max_queue]}, ``versions`` [[name, version, path,
    signature, model.json dict, engine info dict]], ``index`` rows).

    Args:
        ready: whether the engine serves its default model.
        failure: why it failed, or "".
        table: the route table (None until warm).

    Returns:
        The header.
    """
    return {"op": STATUS, "ready": ready, "failure": failure, **({"table": table} if table is not None else {})}
