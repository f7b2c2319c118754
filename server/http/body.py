"""Request bodies read under a size limit: Content-Length is checked first, then every streamed chunk."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser, parse_options_header  # python-multipart's
from starlette.requests import ClientDisconnect, Request

from ..errors import APIError

FILE_FIELD = "file"
RAW_TYPES = ("image/", "application/octet-stream")


def _too_large(limit: int) -> APIError:
    return APIError(413, "payload_too_large", f"request body exceeds {limit} bytes "
                    f"({limit / 1048576:g} MB, --max-body-mb)")


def check_content_length(request: Request, limit: int) -> None:
    """Refuse a declared body over ``limit`` before reading a byte of it."""
    check_declared(request.headers.get("content-length", ""), limit)


def check_declared(declared: str, limit: int) -> None:
    """Refuse a body whose Content-Length header (``declared``; "" when absent) is over ``limit``."""
    if declared.isascii() and declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        raise _too_large(limit)


async def read_limited(request: Request, limit: int) -> bytes:
    """The whole body of ``request`` (at most ``limit`` bytes): :func:`read_body`."""
    return await read_body(request.receive, limit, request.headers.get("content-length", ""))


async def read_body(receive: Any, limit: int, declared: str = "") -> bytes:
    """The whole body (at most ``limit`` bytes; ``declared``: the Content-Length header, checked first): the
    ASGI messages read directly (no async-generator chain; a body in one message is returned without a copy).

    Args:
        receive: the request's ASGI ``receive``.
        limit: the most bytes taken.
        declared: the request's Content-Length ("" when absent).

    Returns:
        The body.

    Raises:
        APIError: 413 over ``limit``.
        ClientDisconnect: the client left before the body was in.
    """
    check_declared(declared, limit)
    chunks = []
    total = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        body = message.get("body", b"")
        total += len(body)
        if total > limit:
            raise _too_large(limit)
        if body:
            chunks.append(body)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def read_images(request: Request, limit: int, max_files: int) -> list[bytes]:
    """Image payloads of a request: multipart field ``file`` (repeatable) or a raw image body."""
    ctype = request.headers.get("content-type", "").lower()
    if ctype.startswith("multipart/form-data"):
        return await _read_multipart(request, limit, max_files)
    if ctype.startswith(RAW_TYPES) or not ctype:
        data = await read_limited(request, limit)
        if not data:
            raise APIError(400, "empty_body", "empty request body; send an image (raw body with an image "
                           "content type, or multipart field 'file')")
        return [data]
    raise APIError(415, "unsupported_media_type", f"content type {ctype!r} is not accepted; send "
                   "multipart/form-data with field 'file' or a raw body with an image/* content type")


class ImageFormParser(MultiPartParser):
    """Starlette's parser, except that a part named ``file`` is always a file (raw bytes), even without a
    ``filename`` in its Content-Disposition: no text decoding, no 1 MB text-field cap. Other fields are text."""

    def on_headers_finished(self) -> None:
        """Give a filename-less ``file`` part an empty filename so the base class spools it as a file."""
        _, options = parse_options_header(self._current_part.content_disposition)
        if options.get(b"name") == FILE_FIELD.encode() and b"filename" not in options:
            self._current_part.content_disposition += b'; filename=""'
        super().on_headers_finished()


async def _read_multipart(request: Request, limit: int, max_files: int) -> list[bytes]:
    body = await read_limited(request, limit)
    files = split_files(body, request.headers.get("content-type", ""), max_files)
    if files is not None:  # the common body: one or a few plain `file` parts
        return files
    return await _parse_multipart(request, _replay(body), max_files)


async def _replay(body: bytes) -> AsyncIterator[bytes]:
    yield body


def split_files(body: bytes, content_type: str, max_files: int) -> list[bytes] | None:
    """The ``file`` parts of a well-formed multipart body whose every part is a ``file`` part with at most
    Content-Disposition and Content-Type headers (1..max_files of them); ``None`` for anything else, which
    then goes through the full parser (its answers and errors unchanged). A few ``find`` calls instead of
    python-multipart's callbacks and a spooled temporary file per part."""
    boundary = parse_options_header(content_type)[1].get(b"boundary")
    if not boundary:
        return None
    delim = b"--" + boundary
    if not body.startswith(delim + b"\r\n"):
        return None
    files: list[bytes] = []
    pos = len(delim) + 2
    while len(files) < max_files:
        head_end = body.find(b"\r\n\r\n", pos)
        end = body.find(b"\r\n" + delim, head_end + 4) if head_end >= 0 else -1
        if end < 0 or not _is_file_part(body[pos:head_end]):
            return None
        files.append(body[head_end + 4:end])
        pos = end + 2 + len(delim)
        if body[pos:pos + 2] == b"--":
            return files if body[pos + 2:] in (b"", b"\r\n") else None
        if body[pos:pos + 2] != b"\r\n":
            return None
        pos += 2
    return None


def _is_file_part(head: bytes) -> bool:
    """True for part headers that are exactly a form-data disposition named ``file`` (and a content type)."""
    names = []
    for line in head.split(b"\r\n"):
        name, colon, value = line.partition(b":")
        name = name.lower()
        if not colon or name not in (b"content-disposition", b"content-type") or name in names:
            return False
        names.append(name)
        if name == b"content-disposition":
            kind, options = parse_options_header(value)
            if kind != b"form-data" or options.get(b"name") != FILE_FIELD.encode():
                return False
    return b"content-disposition" in names


async def _parse_multipart(request: Request, stream: AsyncIterator[bytes], max_files: int) -> list[bytes]:
    parser = ImageFormParser(request.headers, stream, max_files=max_files + 1)
    try:
        form = await parser.parse()
    except MultiPartException as e:
        if "too many files" in e.message.lower():
            raise APIError(413, "too_many_files",
                           f"more than {max_files} files in one request (--max-images)") from None
        raise APIError(400, "invalid_multipart", f"malformed multipart body ({e.message})") from None
    try:
        files = [f for f in form.getlist(FILE_FIELD) if isinstance(f, UploadFile)]
        if not files:
            raise APIError(400, "missing_file", f"multipart body has no file field {FILE_FIELD!r} "
                           f"(fields: {sorted(form.keys())})")
        if len(files) > max_files:
            raise APIError(413, "too_many_files",
                           f"{len(files)} files in one request; the limit is {max_files} (--max-images)")
        return [await f.read() for f in files]
    finally:
        await form.close()
