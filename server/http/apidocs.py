"""``/docs`` (Swagger UI) served with its script, style and icon from this host, never a CDN.

FastAPI's own page loads Swagger UI from cdn.jsdelivr.net (and a favicon from fastapi.tiangolo.com), so on a
host without Internet access it stays blank. The ``fastapi-offline`` package (a base dependency, a 0.8 MB
wheel) ships the same bundle; its folder is mounted at ``/docs/assets`` and the page points there. FastAPI's
``/redoc`` is off: ReDoc's bundle fetches its logo from cdn.redoc.ly. The page, its assets and
``/openapi.json`` sit behind the API key like every other route.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request
from starlette.responses import HTMLResponse

ASSETS = "/docs/assets"


def assets_dir() -> Path | None:
    """The folder of the offline Swagger UI bundle (``fastapi_offline/static``), or None when the package is
    not installed (found without importing it)."""
    spec = importlib.util.find_spec("fastapi_offline")
    locations = list(spec.submodule_search_locations or []) if spec else []
    found = [Path(location) / "static" for location in locations if (Path(location) / "static").is_dir()]
    return found[0] if found else None


def install_api_docs(app: FastAPI) -> None:
    """Add ``/docs`` and its assets to ``app`` (built with ``docs_url=None, redoc_url=None``).

    Args:
        app: the application; without the assets' package the page is not added (``/docs`` is then a 404;
            the API pages under docs/api/ describe every route).
    """
    static = assets_dir()
    if static is None:
        return
    app.mount(ASSETS, StaticFiles(directory=static), name="docs-assets")
    title = f"{app.title} API"

    openapi = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = _root(request)
        return get_swagger_ui_html(openapi_url=root + openapi, title=title,
                                   swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{root}{ASSETS}/favicon.png")


def _root(request: Request) -> str:
    """The path the app is served under (``root_path``, behind a proxy), without a trailing slash."""
    return str(request.scope.get("root_path", "")).rstrip("/")
