"""server/http/apidocs.py: /docs (Swagger UI) loads every script, style and icon from the server itself, so it
renders on a host without Internet access; the assets answer with their content; /redoc (whose bundle fetches
a logo from a CDN) is off."""

from __future__ import annotations

import re

import httpx

from irpe.server.http.apidocs import ASSETS, assets_dir

_URL = re.compile(r"""(?:src|href|spec-url)\s*=\s*["']([^"']+)["']|url:\s*['"]([^'"]+)['"]""")
EXPECTED = {"swagger-ui-bundle.js", "swagger-ui.css", "favicon.png"}


def test_the_assets_package_is_installed() -> None:
    found = assets_dir()
    assert found is not None, "fastapi-offline (a base dependency) is missing: reinstall the package"
    assert {p.name for p in found.iterdir()} >= EXPECTED


def test_the_page_loads_nothing_from_another_host(server_url: str) -> None:
    answer = httpx.get(server_url + "/docs")
    assert answer.status_code == 200 and "text/html" in answer.headers["content-type"]
    urls = {a or b for a, b in _URL.findall(answer.text)}
    assert urls and all(url.startswith("/") and not url.startswith("//") for url in urls), urls
    assert "/openapi.json" in urls
    names = {url.removeprefix(ASSETS + "/") for url in urls if url.startswith(ASSETS + "/")}
    assert names == EXPECTED, urls
    for name in names:
        asset = httpx.get(f"{server_url}{ASSETS}/{name}")
        assert asset.status_code == 200 and len(asset.content) > 1000, (name, asset.status_code)
        kind = {"js": "javascript", "css": "text/css", "png": "image/png"}[name.rsplit(".", 1)[1]]
        assert kind in asset.headers["content-type"], (name, asset.headers["content-type"])


def test_redoc_is_off_and_the_page_is_not_in_the_api_schema(server_url: str) -> None:
    assert httpx.get(server_url + "/redoc").status_code == 404
    paths = httpx.get(server_url + "/openapi.json").json()["paths"]
    assert not {"/docs", "/redoc"} & set(paths)
