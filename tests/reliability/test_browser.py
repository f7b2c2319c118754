"""The demo page in headless Chromium: upload an image, see the top-5 bars, save a screenshot."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.reliability.procs import REPO, ServerProcess
from tests.server.helpers import encode, image

CHROMIUM = os.environ.get("IRPE_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOT = REPO / "test-artifacts" / "browser-classify.png"


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
