"""The dashboard in a real headless Chromium (Debian's, driven by Playwright) on known rows: every chart's ECharts
instance holds the expected values, filters update them and the URL, a new result appears after one poll without a
reload, review text renders as text, no console errors. Screenshots go to .run/artifacts/dashboard/."""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from qwenspark.config import QwenSparkConfig
from qwenspark.dashboard.app import create_app
from tests.dashboard.conftest import HOSTILE_SUMMARY, artifacts, insert_results

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra (make test installs it)")

CHARTS = ("mix", "trend", "ranking", "heatmap", "runs")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def served(known: QwenSparkConfig) -> Iterator[str]:
    """The app on a free loopback port in a background thread; its base URL."""
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(known), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the dashboard did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def browser() -> Iterator[Any]:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("chromium is not installed: run `make browser` (Debian's chromium package)")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield b
        b.close()


class Page:
    """A dashboard page with its console errors and helpers to read the charts."""

    def __init__(self, browser: Any, url: str) -> None:
        self.errors: list[str] = []
        self.page = browser.new_page(viewport={"width": 1500, "height": 1100})
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.started = time.monotonic()
        self.page.goto(url)
        self.wait_polls(1)
        self.load_s = time.monotonic() - self.started

    def polls(self) -> int:
        return int(self.page.evaluate("() => (window.qwenspark || {}).polls || 0"))

    def wait_polls(self, n: int, timeout_s: float = 20) -> None:
        deadline = time.monotonic() + timeout_s
        while self.polls() < n:
            assert time.monotonic() < deadline, f"the page did not finish poll {n}: {self.errors}"
            time.sleep(0.05)

    def refreshed(self, action: Any) -> None:
        """Run action (a filter change) and wait for the refresh it starts."""
        before = self.polls()
        action()
        self.wait_polls(before + 1)

    def series(self, chart: str) -> list[dict[str, Any]]:
        """The series of a chart as its ECharts instance holds them (name and data)."""
        return self.page.evaluate(  # type: ignore[no-any-return]
            "(c) => window.qwenspark.charts[c].getOption().series.map(s => ({name: s.name, data: s.data}))", chart)

    def axis(self, chart: str, axis: str) -> list[Any]:
        return self.page.evaluate(  # type: ignore[no-any-return]
            "([c, a]) => window.qwenspark.charts[c].getOption()[a][0].data", [chart, axis])

    def empty_text(self, chart: str) -> str | None:
        return self.page.evaluate(  # type: ignore[no-any-return]
            "(c) => { const g = window.qwenspark.charts[c].getOption().graphic;"
            " const e = g && g[0] && g[0].elements && g[0].elements[0]; return e ? e.style.text : null; }", chart)

    def mix(self, index: int = 0) -> dict[str, int]:
        return {d["name"]: d["value"] for d in self.series("mix")[index]["data"]}


def test_every_chart_holds_the_known_figures(served: str, browser: Any) -> None:
    p = Page(browser, served + "/?from=2026-03-01&to=2026-03-05")
    assert p.mix() == {"positive": 2, "negative": 2, "mixed": 1, "errors": 1}
    trend = {s["name"]: s["data"] for s in p.series("trend")}
    assert p.axis("trend", "xAxis") == ["2026-03-01", "2026-03-02", "2026-03-03", "2026-03-04", "2026-03-05"]
    assert trend["reviews"] == [3, 1, 2, 0, 0]
    assert trend["negative share"][:3] == [round(2 / 3, 4), 0, 0] and trend["negative share"][3:] == [None, None]
    ranking = p.series("ranking")[0]["data"]
    assert [(d["name"], d["value"]) for d in ranking] == [("H01", 0), ("H02", 0), ("H03", None)]
    assert p.axis("heatmap", "xAxis") == ["H01", "H02", "H03"][: len(p.axis("heatmap", "xAxis"))]
    cells = p.series("heatmap")[0]["data"]
    service = p.axis("heatmap", "yAxis").index("service")
    assert [1, service, 1, 1] in cells  # H02 x service: 100 % negative of 1 mention
    runs = {s["name"]: s["data"] for s in p.series("runs")}
    assert [d["value"] for d in runs["rows analysed"]] == [0, 6]  # oldest first
    assert runs["error rate"] == [None, round(1 / 6, 4)]
    listed = p.page.eval_on_selector_all("#reviews article", "els => els.map(e => e.dataset.reviewId)")
    assert listed == ["3", "2", "9223372036854775807"]
    # The hostile review and summary show as text; nothing of theirs ran.
    hostile = p.page.locator('article[data-review-id="9223372036854775807"]')
    assert hostile.locator(".summary").text_content() == HOSTILE_SUMMARY
    assert hostile.locator(".text").text_content().startswith("<script>")
    assert p.page.evaluate("() => window.__pwned") is None
    assert p.page.locator("#reviews script, #reviews img, #reviews b").count() == 0
    assert "Last run: succeeded" in p.page.locator("#run-summary").text_content()
    p.page.screenshot(path=artifacts() / "known.png", full_page=True)
    assert p.errors == []
    assert p.load_s < 10  # first load; the bench measures it properly


def test_filters_update_the_charts_and_the_url(served: str, browser: Any) -> None:
    p = Page(browser, served + "/?from=2026-03-01&to=2026-03-05")
    mix_chart = p.page.evaluate("() => { window.__before = window.qwenspark.charts.mix; return 1; }")
    assert mix_chart == 1
    p.refreshed(lambda: p.page.select_option("#f-lang", "zh"))
    assert p.mix() == {"positive": 1, "negative": 1}
    assert "lang=zh" in p.page.url
    p.refreshed(lambda: (p.page.fill("#f-hotel", "H01"), p.page.press("#f-hotel", "Enter")))
    assert "hotel=H01" in p.page.url
    assert len(p.series("mix")) == 2 and p.mix(1) == {"negative": 1}  # inner ring: H01's one zh review
    assert p.page.evaluate("() => window.__before === window.qwenspark.charts.mix")  # same instance: no reload
    # A shared link restores the state.
    q = Page(browser, p.page.url)
    assert q.page.input_value("#f-hotel") == "H01" and q.page.input_value("#f-lang") == "zh"
    assert q.mix(1) == {"negative": 1}
    p.page.screenshot(path=artifacts() / "filtered.png", full_page=True)
    assert p.errors == [] and q.errors == []


def test_a_new_result_appears_after_one_poll(served: str, browser: Any, known: QwenSparkConfig) -> None:
    p = Page(browser, served + "/?from=2026-03-01&to=2026-03-05&poll=1")
    p.page.evaluate("() => { window.__marker = 'same page'; }")
    assert p.mix()["positive"] == 2
    insert_results(known, [(77, "H03", "2026-03-04 10:00:00", "en", "positive", "Lovely", [("staff", "positive")],
                            None, "Lovely staff")])
    polls = p.polls()
    p.wait_polls(polls + 2, timeout_s=15)  # the one in flight may have read before the insert
    assert p.mix()["positive"] == 3
    trend = {s["name"]: s["data"] for s in p.series("trend")}
    assert trend["reviews"] == [3, 1, 2, 1, 0]
    assert p.page.evaluate("() => window.__marker") == "same page"
    assert "Updated" in p.page.locator("#refreshed").text_content()
    assert p.errors == []


def test_an_unknown_hotel_is_said_and_an_empty_range_says_so(served: str, browser: Any) -> None:
    p = Page(browser, served + "/?from=2026-04-01&to=2026-04-30")
    assert p.empty_text("mix") == "No results in this range"
    assert p.empty_text("trend") == "No reviews in this range"
    assert "No negative or mixed reviews" in p.page.locator("#reviews").text_content()
    p.page.screenshot(path=artifacts() / "empty-range.png", full_page=True)
    p.refreshed(lambda: (p.page.fill("#f-hotel", "NOPE"), p.page.press("#f-hotel", "Enter")))
    assert "no results for hotel 'NOPE'" in p.page.locator("#problem").text_content()
    # The 404s of the API are console errors of the browser's own: only those are allowed here.
    assert all("404" in e for e in p.errors), p.errors


def test_many_hotels_render_top_n_and_others(served: str, browser: Any, known: QwenSparkConfig) -> None:
    insert_results(known, [(1000 + i, f"hotel-{i:05d}-with-a-long-name", f"2026-03-{1 + i % 5:02d} 10:00:00", "en",
                            "negative" if i % 3 == 0 else "positive", "s",
                            [("room", "negative" if i % 3 == 0 else "positive"), ("wifi", "positive")], None, "t")
                           for i in range(3000)])
    p = Page(browser, served + "/?from=2026-03-01&to=2026-03-05")
    names = p.axis("ranking", "yAxis")
    assert len(names) == 21 and names[-1] == "others (2983 hotels)"
    assert p.axis("heatmap", "xAxis")[-1] == "others"
    p.page.screenshot(path=artifacts() / "many-hotels.png", full_page=True)
    assert p.errors == []
