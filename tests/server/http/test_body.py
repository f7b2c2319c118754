"""The multipart fast path returns exactly the full parser's files, or steps aside."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers, UploadFile

from irpe.server.http.body import ImageFormParser, split_files

BOUNDARY = "irpe-b0undary"
CTYPE = f"multipart/form-data; boundary={BOUNDARY}"


def body(parts: list[tuple[bytes, bytes]], preamble: bytes = b"", epilogue: bytes = b"\r\n") -> bytes:
    """Parts as (header lines, content)."""
    out = preamble
    for head, content in parts:
        out += f"--{BOUNDARY}\r\n".encode() + head + b"\r\n\r\n" + content + b"\r\n"
    return out + f"--{BOUNDARY}--".encode() + epilogue


def file_head(filename: str | None = "a.jpg", ctype: str | None = "image/jpeg") -> bytes:
    disposition = b'Content-Disposition: form-data; name="file"' + (f'; filename="{filename}"'.encode()
                                                                    if filename is not None else b"")
    return disposition + (f"\r\nContent-Type: {ctype}".encode() if ctype else b"")


def full_parser(data: bytes, content_type: str = CTYPE, max_files: int = 32) -> list[bytes]:
    """What starlette + python-multipart make of the body (the path every odd body takes)."""

    async def run() -> list[bytes]:
        async def stream():
            yield data

        form = await ImageFormParser(Headers({"content-type": content_type}), stream(), max_files=max_files + 1).parse()
        try:
            return [await f.read() for f in form.getlist("file") if isinstance(f, UploadFile)]
        finally:
            await form.close()

    return asyncio.run(run())


def test_common_bodies_take_the_fast_path() -> None:
    jpeg = b"\xff\xd8" + bytes(range(256)) * 40 + b"\r\n--not-the-boundary\r\n\xff\xd9"
    for parts in ([(file_head(), jpeg)], [(file_head(None, None), jpeg)], [(file_head(), jpeg), (file_head(), b"x")],
                  [(file_head("", "application/octet-stream"), b"")]):
        for epilogue in (b"", b"\r\n"):
            data = body(parts, epilogue=epilogue)
            fast = split_files(data, CTYPE, 32)
            assert fast == full_parser(data) == [c for _, c in parts]


def test_other_bodies_go_to_the_full_parser() -> None:
    jpeg = b"\xff\xd8data\xff\xd9"
    text = b'Content-Disposition: form-data; name="note"'
    cases = [body([(file_head(), jpeg), (text, b"hi")]),  # a text field
             body([(file_head(), jpeg)], preamble=b"preamble\r\n"),
             body([(file_head(), jpeg)], epilogue=b"\r\nepilogue"),
             body([(file_head() + b"\r\nContent-Transfer-Encoding: binary", jpeg)]),
             body([(file_head(), jpeg)])[:-12],  # truncated
             body([(b'Content-Disposition: attachment; name="file"', jpeg)])]
    for data in cases:
        assert split_files(data, CTYPE, 32) is None
    assert split_files(body([(file_head(), jpeg)] * 3), CTYPE, 2) is None  # over --max-images: the parser says 413
    assert split_files(body([(file_head(), jpeg)]), "multipart/form-data", 32) is None  # no boundary


_CHUNKS = st.sampled_from([b"\r\n", b"--", BOUNDARY.encode(), b"\r\n--" + BOUNDARY.encode(), b"\xff\xd8", b"x",
                           b"\r\n\r\n", b"Content-Disposition: form-data; name=\"file\""])
_CONTENT = st.lists(_CHUNKS, max_size=8).map(b"".join)
_HEAD = st.sampled_from([file_head(), file_head(None, None), file_head("b.png", "image/png"),
                         b'Content-Disposition: form-data; name="other"', b"content-disposition: form-data; name=file",
                         b'Content-Disposition: form-data; name="file"\r\nContent-Disposition: form-data; name="x"'])


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.tuples(_HEAD, _CONTENT), min_size=1, max_size=4),
       epilogue=st.sampled_from([b"", b"\r\n", b"--", b"junk"]))
def test_fast_path_agrees_with_the_parser(parts: list[tuple[bytes, bytes]], epilogue: bytes) -> None:
    """Whenever the fast path answers, the full parser finds the same files (or fails the same body anyway)."""
    data = body(parts, epilogue=epilogue)
    fast = split_files(data, CTYPE, 32)
    if fast is None:
        return
    try:
        parsed = full_parser(data)
    except Exception as e:  # the parser refuses a body the fast path accepted: a real disagreement
        raise AssertionError(f"fast path accepted a body the parser refuses: {e!r}") from None
    assert fast == parsed


def test_bodies_in_pieces_over_the_limit_and_cut_short(tiny_artifact: Path) -> None:
    """read_limited over real HTTP: a body sent in several pieces arrives whole; a chunked body over
    --max-body-mb is 413 once the limit passes; a client that leaves mid-upload is counted as 499 and the
    server keeps serving."""
    import socket
    import time

    import httpx

    from tests.server.helpers import encode, image, running_server

    with running_server(tiny_artifact, max_body_mb=0.05, max_wait_ms=2) as url:
        host, port = url.removeprefix("http://").split(":")
        png = encode(image(seed=9))
        pieces = [png[i:i + 97] for i in range(0, len(png), 97)]
        ok = httpx.post(url + "/classify", content=iter(pieces), headers={"content-type": "image/png"})
        assert ok.status_code == 200 and len(ok.json()["predictions"]) == 1
        big = httpx.post(url + "/classify", content=iter([b"\x89PNG" + bytes(40_000)] * 3),
                         headers={"content-type": "image/png"})
        assert big.status_code == 413 and big.json()["error"]["code"] == "payload_too_large"
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"POST /classify HTTP/1.1\r\nHost: localhost\r\nContent-Type: image/png\r\n"
                      b"Content-Length: 30000\r\n\r\n" + png[:500])
            time.sleep(0.2)
        deadline = time.monotonic() + 10
        while '"499"' not in (metrics := httpx.get(url + "/metrics").text) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any('route="/classify"' in line and 'status="499"' in line for line in metrics.splitlines())
        assert httpx.post(url + "/classify", content=png, headers={"content-type": "image/png"}).status_code == 200
