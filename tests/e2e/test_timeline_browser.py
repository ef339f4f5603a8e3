"""The timeline in a real headless browser (Debian's chromium driven by playwright): what a
user sees, no console error, no request of any kind beyond the page's own file."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ci import unavailable
from tests.conftest import BIN, _env, run_torchx
from tests.timeline_jobs import generated_job, write_crash_files, write_events

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        unavailable(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class OpenPage:
    """A page opened from ``file://`` with every request routed: the page's own file is
    served, anything else is recorded and refused."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.url = path.resolve().as_uri()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.context = browser.new_context(viewport={"width": 1200, "height": 800})
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.goto(self.url)

    def _route(self, route: Any) -> None:
        if route.request.url == self.url:
            route.continue_()
        else:
            self.requests.append(route.request.url)
            route.abort()

    def _console(self, message: Any) -> None:
        if message.type in ("error", "warning"):
            self.errors.append(message.text)

    def texts(self, selector: str) -> list[str]:
        return [t.strip() for t in self.page.locator(selector).all_text_contents()]

    def close(self) -> None:
        assert self.errors == []
        assert self.requests == []
        self.context.close()


@pytest.mark.slow
def test_timeline_of_a_real_2x2_job_with_a_crash_and_a_restart(workdir: Path, browser: Any) -> None:
    result = run_torchx(
        "run",
        "-s",
        "local_cwd",
        "dist.ddp",
        "-j",
        "2x2",
        "--max_retries",
        "1",
        "--script",
        "resume.py",
        "--",
        "--checkpoint",
        str(workdir / "resume.pt"),
        "--crash-at-step",
        "25",
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    told = re.search(
        r"^torchx-elastic: resume restarted or failed; its timeline:"
        r" torchx-elastic timeline (\S+)$",
        result.stderr,
        re.MULTILINE,
    )
    assert told, result.stderr
    drawn = subprocess.run(
        [str(BIN / "torchx-elastic"), "timeline", told[1]],
        cwd=workdir,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert drawn.returncode == 0, drawn.stderr
    page_path = Path(told[1]) / "timeline.html"
    assert re.fullmatch(
        r"timeline of resume-\w+ \(resume\): " + re.escape(str(page_path)) + "\n", drawn.stdout
    )

    view = OpenPage(browser, page_path)
    page = view.page
    nodes = view.texts("svg text.node-label")
    assert [re.sub(r" · .* \(", " (", n) for n in nodes] == ["▾ node 0 (2)", "▾ node 1 (2)"]
    assert view.texts("svg text.lane-label") == [
        "rank 0 (local 0)",
        "rank 1 (local 1)",
        "rank 2 (local 0)",
        "rank 3 (local 1)",
    ]
    cause = (
        "restart 1 after rank 1 (node 0) failed first: exit code 1,"
        " RuntimeError: simulated crash at step 25"
    )
    assert page.locator("text.restart-label").is_visible()
    assert view.texts("text.restart-label")[0].startswith("restart 1 after rank 1 (node 0)")
    assert view.texts(".restart-item")[0].endswith(cause)
    # the failing rank: on hover, then its details on click (exit code and traceback)
    failure = page.locator("g.mark-failure").last  # on rank 1's own lane
    failure.hover()
    assert page.locator("#tip").inner_text().startswith("rank 1: exit code 1\n")
    failure.click()
    details = page.locator("#details").inner_text()
    assert details.startswith("rank 1: exit code 1\n")
    assert "Traceback (most recent call last):" in details
    assert "RuntimeError: simulated crash at step 25" in details
    assert "victim" in page.locator("#failures summary").inner_text()
    # folding node 0 hides its rank lanes
    page.locator("svg text.node-label").first.click()
    assert view.texts("svg text.lane-label") == ["rank 2 (local 0)", "rank 3 (local 1)"]
    assert page.locator("#progress polyline").count() == 2
    view.close()

    traced = subprocess.run(
        [str(BIN / "torchx-elastic"), "timeline", told[1], "--format", "trace"],
        cwd=workdir,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert traced.returncode == 0, traced.stderr
    events = json.loads((Path(told[1]) / "timeline.trace.json").read_text())["traceEvents"]
    assert any(e["ph"] == "i" and e["name"] == "rank 1: exit code 1" for e in events)


def test_64x8_job_opens_folded_and_unfolds(tmp_path: Path, browser: Any) -> None:
    from torchx_elastic.timeline import html
    from torchx_elastic.timeline.log_dir import timeline_of_dir

    write_events(tmp_path, generated_job(64, 8, progress_samples=1000))
    write_crash_files(tmp_path)
    page_path = tmp_path / "timeline.html"
    page_path.write_text(html.render(timeline_of_dir(str(tmp_path))))
    view = OpenPage(browser, page_path)
    assert len(view.texts("svg text.node-label")) == 64
    assert view.texts("svg text.lane-label") == []  # folded: 512 ranks
    view.page.locator("#unfold").click()
    assert len(view.texts("svg text.lane-label")) == 512
    assert view.texts("#failures summary") == [
        "511 victims (lost a peer, or stopped after another rank failed)"
    ]
    view.close()
