"""The demo page in headless Chromium: upload an image, see the top-5 bars, save a screenshot."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import pytest

from tests.reliability.procs import REPO, ServerProcess, serving
from tests.server.helpers import encode, image

CHROMIUM = os.environ.get("IRPE_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOT = REPO / "test-artifacts" / "browser-classify.png"
pytestmark = pytest.mark.browser  # IRPE_TEST_WITHOUT=browser opts out (tests/conftest.py)


def test_demo_page_classifies_an_upload(server: ServerProcess, tmp_path: Path) -> None:
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no chromium at {CHROMIUM} (run scripts/install-browser.sh)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    sample = tmp_path / "sample.png"
    sample.write_bytes(encode(image((160, 120), seed=7)))
    console_errors: list[str] = []
    failed: list[str] = []  # responses >= 400 (the browser's automatic /favicon.ico request aside)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True, timeout=60_000)
        try:
            page = browser.new_page(viewport={"width": 900, "height": 760})
            page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
            page.on("response", lambda r: failed.append(f"{r.status} {r.url}")
                    if r.status >= 400 and not r.url.endswith("/favicon.ico") else None)
            page.goto(server.url + "/", timeout=30_000)
            assert page.title() == "irpe-deploy"
            page.locator("#model").filter(has_text="tiny-mean").wait_for(timeout=15_000)
            page.set_input_files("#file", str(sample))
            bars = page.locator("#bars .bar")
            bars.nth(4).wait_for(timeout=30_000)
            assert bars.count() == 5
            labels = bars.locator("span.label").all_text_contents()
            assert all(label.startswith("class_") for label in labels), labels
            widths = [float(w.rstrip("%")) for w in bars.locator("span:last-child").all_text_contents()]
            assert widths == sorted(widths, reverse=True) and 0 < sum(widths) <= 100.5, widths
            tracks = [bars.nth(i).locator("div.track").bounding_box() for i in range(5)]
            edges = {(round(t["x"], 1), round(t["x"] + t["width"], 1)) for t in tracks if t}
            assert len(tracks) == 5 and len(edges) == 1, f"bar tracks do not line up: {edges}"
            pct = bars.locator("span.pct")
            assert pct.count() == 5 and pct.first.evaluate("e => getComputedStyle(e).textAlign") == "right"
            assert page.locator("#error").text_content() == ""
            assert page.locator("#preview").is_visible()
            SCREENSHOT.parent.mkdir(exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True)
        finally:
            browser.close()
    assert SCREENSHOT.stat().st_size > 5_000
    assert not failed, failed
    assert not [e for e in console_errors if not e.startswith("Failed to load resource")], console_errors
    shutil.copy(SCREENSHOT, tmp_path / SCREENSHOT.name)


# Strokes in canvas pixels (224 x 224), drawn with the mouse as a person would: digit -> polylines.
_ELLIPSE = [(112 + 45 * math.sin(2 * math.pi * k / 24), 112 - 70 * math.cos(2 * math.pi * k / 24)) for k in range(25)]
DRAWINGS = {
    "0": [_ELLIPSE],
    "1": [[(100, 62), (118, 40), (118, 186)]],
    "7": [[(62, 48), (166, 48), (100, 188)]],
}


def test_drawn_digits_are_classified_by_the_shipped_model(tmp_path: Path) -> None:
    """Draw on the page's canvas with the mouse (white on black, 18 px pen), press Classify, read the top bar."""
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no chromium at {CHROMIUM} (run scripts/install-browser.sh)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    got: dict[str, str] = {}
    with serving(Path("digits")) as server, sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True, timeout=60_000)
        try:
            page = browser.new_page(viewport={"width": 900, "height": 760})
            page.goto(server.url + "/", timeout=30_000)
            page.locator("#model").filter(has_text="deit_micro").wait_for(timeout=15_000)
            box = page.locator("#pad").bounding_box()
            assert box is not None and round(box["width"]) >= 224
            for digit, strokes in DRAWINGS.items():
                page.click("#clear")
                for stroke in strokes:
                    page.mouse.move(box["x"] + stroke[0][0], box["y"] + stroke[0][1])
                    page.mouse.down()
                    for x, y in stroke[1:]:
                        page.mouse.move(box["x"] + x, box["y"] + y, steps=4)
                    page.mouse.up()
                ink = page.evaluate("() => { const d = document.getElementById('pad').getContext('2d')"
                                    ".getImageData(0, 0, 224, 224).data; let n = 0;"
                                    " for (let i = 0; i < d.length; i += 4) n += d[i] > 128; return n; }")
                assert ink > 1000, f"{digit}: the strokes left only {ink} white pixels on the canvas"
                page.evaluate("() => { document.getElementById('bars').innerHTML = ''; }")  # no stale bars
                with page.expect_response(lambda r: "/classify" in r.url) as resp:
                    page.click("#classify-pad")
                assert resp.value.status == 200
                page.locator("#bars .bar").nth(4).wait_for(timeout=30_000)
                got[digit] = page.locator("#bars .bar span.label").first.text_content() or ""
                page.screenshot(path=str(tmp_path / f"drawn-{digit}.png"))
        finally:
            browser.close()
    assert got == {d: d for d in DRAWINGS}, got


def test_api_docs_render_with_no_other_host_reachable(server: ServerProcess, tmp_path: Path) -> None:
    """/docs (Swagger UI) renders when every request to another host fails, as on an air-gapped host."""
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no chromium at {CHROMIUM} (run scripts/install-browser.sh)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    elsewhere: list[str] = []

    def local_only(route) -> None:  # type: ignore[no-untyped-def]
        if route.request.url.startswith(server.url):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True, timeout=60_000)
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 900})
            page.route("**/*", local_only)
            page.goto(server.url + "/docs", timeout=30_000)
            page.locator(".swagger-ui .info .title").filter(has_text="irpe-deploy").wait_for(timeout=30_000)
            page.locator(".opblock-summary-path").filter(has_text="/classify").first.wait_for(timeout=15_000)
            page.screenshot(path=str(tmp_path / "docs.png"))
        finally:
            browser.close()
    assert elsewhere == [], f"the page asked other hosts for {elsewhere}"
