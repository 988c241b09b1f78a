"""The dashboard in headless Chromium (Debian's `chromium`, driven by Playwright): it loads offline from the server
alone and shows live numbers after a request. The screenshot lands in tests/artifacts/dashboard.png."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest
from serve_support import running_server

from rooftop.quant.linear import widen_dtype

ARTIFACTS = Path(__file__).parent / "artifacts"


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail(
            "the dashboard test needs Chromium and found none on PATH: install Debian's package "
            "(`apt-get install -y chromium`, which `make test` does when apt is available)",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="module")
def server(long_gguf):
    """int4 weights: decode runs the weight-only kernels, prefill widens them, so the chart has two compute roofs."""
    with running_server(long_gguf, {"max_model_len": 256, "weights": "int4"}) as url:
        yield url


def test_dashboard_shows_live_numbers(server):
    from playwright.sync_api import sync_playwright

    executable = chromium()
    body = {"prompt": "light up the dashboard", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    assert httpx.post(f"{server}/v1/completions", json=body, timeout=60).status_code == 200
    peaks = httpx.get(f"{server}/dashboard/state").json()["roofline"]["peaks"]
    widened = [] if widen_dtype() is None else ["bf16"]  # the peak prefill chunks widen to, where they widen
    assert sorted(p["compute"] for p in peaks) == sorted([*widened, "int4_weight_only"])
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1100})
            outside = []
            page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(server) else None)
            page.goto(server)
            page.wait_for_function("document.getElementById('status').textContent === 'live'", timeout=15_000)
            page.wait_for_function("Number(document.getElementById('finished').textContent) >= 1", timeout=15_000)
            assert page.text_content("#model") == "tiny-long"
            assert page.text_content("#running") == "0" and page.text_content("#waiting") == "0"
            assert page.text_content("#kv").endswith("%")
            assert page.text_content("#ttft-p50").endswith(" ms") and page.text_content("#tpot-p50").endswith(" ms")
            assert "decode:" in page.text_content("#achieved") and "FLOP/s" in page.text_content("#achieved")
            assert "bound" in page.text_content("#achieved") and "expected" in page.text_content("#achieved")
            assert page.text_content("#hardware").startswith("this machine")
            roof_pixels = page.evaluate(
                "(() => { const c = document.getElementById('roofline');"
                " const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
                " let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; })()"
            )
            assert roof_pixels > 1000  # the roof and the steps were drawn
            ARTIFACTS.mkdir(exist_ok=True)
            shot = ARTIFACTS / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"dashboard screenshot: {shot}")
            assert outside == []  # no CDN, no fonts from elsewhere: it works offline
        finally:
            browser.close()
