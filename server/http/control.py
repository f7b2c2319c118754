"""What a model control request over HTTP (``POST /v2/repository/models/{m}/load|unload``) may be; the same
rules hold for ``POST /v2/logging`` (Triton's log settings: turning the log off hides what the server does).

Refused (403) when a browser says it comes from another site: an ``Origin`` that is not this server's own
(``Host``), or ``Sec-Fetch-Site`` other than ``same-origin`` / ``none``; and (415) when its body has a
content type other than JSON. Any web page can make a browser send a "simple" cross-site POST
(``text/plain``, a form, a typeless blob) to a loopback server; browsers always add ``Origin`` and
``Sec-Fetch-Site`` to it, and a JSON content type forces a CORS preflight this server never grants.
Scripted clients (tritonclient sends ``{}`` with no content type) send neither header. Who may control
models at all (the admin key, loopback) is :mod:`..pipeline.control`. The body is Triton's: ``parameters``
this server does not support (a model ``config``, ``file:`` contents) are a 400, never silently ignored.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from fastapi import Request

from ..errors import APIError
from ..pipeline.control import check_admin, run_control
from ..pipeline.service import Service
from .body import read_limited

CONTROL_PATH = re.compile(r"/v2/repository/models/[^/]+/(load|unload)")
ADMIN_PATHS = frozenset({"/v2/logging"})  # besides model control: server settings
MAX_CONTROL_BODY = 64 * 1024
_UNLOAD_PARAMETERS = frozenset({"unload_dependents"})  # no model here has dependents


def is_admin_path(path: str) -> bool:
    """Model control or a server setting: the admin key, where one is set, stands in for the inference key."""
    return path in ADMIN_PATHS or CONTROL_PATH.fullmatch(path) is not None


async def run(request: Request, service: Service, name: str, load: bool) -> None:
    """Check the request (:func:`check_control`), then load or unload ``name``."""
    await check_control(request, service, load)
    await run_control(service, name, load)


async def check_control(request: Request, service: Service, load: bool) -> None:
    """Refuse a model control request as :func:`check_admin_call` does, and one whose body asks for what is
    not supported (APIError)."""
    check_admin_call(request, service, "model control")
    _parameters(await read_limited(request, MAX_CONTROL_BODY), load)


def check_admin_call(request: Request, service: Service, what: str) -> None:
    """Refuse an administrative call (model control, Triton's log settings) that a browser sends from another
    site, one without the admin key where one is needed, and one with a body that is not JSON (APIError)."""
    headers = request.headers
    _same_site(headers.get("origin"), headers.get("sec-fetch-site"), headers.get("host", ""), what)
    check_admin(service.settings, headers.get("authorization", ""), what)
    kind = headers.get("content-type", "").split(";")[0].strip().lower()
    if kind and kind != "application/json":
        raise APIError(415, "unsupported_media_type", f"{what} takes a JSON body; got Content-Type {kind!r} "
                       "(send 'Content-Type: application/json', or none)")


def check_same_site(request: Request, what: str, media_types: tuple[str, ...] = ("application/json",)) -> None:
    """Refuse a request that a browser sends from another site (403) and one whose body has a content type
    other than ``media_types`` or none (415): the rules above, for other routes that act on this machine
    (client shared memory: :mod:`.shm_access`)."""
    headers = request.headers
    _same_site(headers.get("origin"), headers.get("sec-fetch-site"), headers.get("host", ""), what)
    kind = headers.get("content-type", "").split(";")[0].strip().lower()
    if kind and kind not in media_types:
        raise APIError(415, "unsupported_media_type", f"{what} takes a body of type {' or '.join(media_types)}; "
                       f"got Content-Type {kind!r} (send one of those, or none)")


def _same_site(origin: str | None, fetch_site: str | None, host: str, what: str) -> None:
    if fetch_site is not None and fetch_site.strip().lower() not in ("same-origin", "none"):
        raise APIError(403, "cross_site", f"{what} refused from a {fetch_site[:32]!r} page "
                       "(Sec-Fetch-Site); call it from a script or the server's own origin")
    if origin is not None and origin.strip().lower() not in (f"http://{host.lower()}", f"https://{host.lower()}"):
        raise APIError(403, "cross_site", f"{what} refused from origin {origin[:100]!r}, not this "
                       "server's; call it from a script or the server's own origin")


def _parameters(raw: bytes, load: bool) -> None:
    """Triton's load/unload body: empty or a JSON object with optional ``parameters``; 400 for anything this
    server would otherwise ignore."""
    if not raw.strip():
        return
    try:
        body: Any = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise APIError(400, "invalid_json", f"model control body is not JSON ({e})") from None
    params = body.get("parameters", {}) if isinstance(body, dict) else None
    if not isinstance(params, dict) or set(body) - {"parameters"}:
        raise APIError(400, "invalid_request", 'model control body must be {} or {"parameters": {...}}')
    extra = sorted(k[:64] for k in set(params) - (set() if load else _UNLOAD_PARAMETERS))
    if extra:
        what = "load" if load else "unload"
        raise APIError(400, "unsupported", f"{what} parameters {extra[:8]} are not supported: the server loads "
                       "the model as the repository holds it (a model config or files in the request are not)")
