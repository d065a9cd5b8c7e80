"""The built documentation, as a reader sees it in a real browser at 1200 px.

Headless Chromium (Debian's ``chromium`` with ``chromium-driver``, driven by Selenium) opens
the pages of the built site with no network. A page fails where an element's content runs past
its box (cut off, or spilling over the page column or a table cell) instead of wrapping or scrolling
inside it, or where math is left as raw LaTeX (MathJax missing, not bundled, or a TeX error).

Outside CI the test is skipped, with the reason, when Chromium, its driver or Selenium is
missing; under CI (``CI`` set) that is a failure: ``.ci/run`` installs them.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

#: The reader's window (the issue's "cut off at 1200 px").
WIDTH, HEIGHT = 1200, 900

#: Chromium without anything that reaches the network or keeps state between runs.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]

#: Pages that must be checked whatever else the site holds: the index, a tutorial, the API.
REQUIRED = ["index.html", "tutorials/03_pyro_quickstart.html", "api.html", "api/infer.html"]

#: Finds what a reader would see as broken; returns a list of sentences.
CHECK = (Path(__file__).parent / "browser_check.js").read_text(encoding="utf-8")

#: Resolves when MathJax has typeset the page (at once on pages without math).
WAIT_FOR_MATH = """
const done = arguments[arguments.length - 1];
const start = Date.now();
(function poll() {
  if (!document.querySelector('.math')) return done('no math');
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    return MathJax.startup.promise.then(() => done('typeset'), (e) => done('error: ' + e));
  }
  if (Date.now() - start > 10000) return done('MathJax did not load');
  setTimeout(poll, 50);
})();
"""


def _missing(what: str):
    reason = f"{what}; install Debian's chromium and chromium-driver (`.ci/run` does)"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the browser test, but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None:
        _missing("no `chromium` on PATH")
    if driver_path is None:
        _missing("no `chromedriver` on PATH")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _missing("Selenium is not installed (it is in the `[test]` extra)")
    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium fetch a driver
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.add_argument(f"--window-size={WIDTH},{HEIGHT}")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_window_size(WIDTH, HEIGHT)
    driver.set_script_timeout(30)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _pages(html) -> list[str]:
    """Every page of the site a reader reaches: the top level, the tutorials, the API."""
    pages = [p.name for p in sorted(html.glob("*.html"))]
    pages += [f"tutorials/{p.name}" for p in sorted((html / "tutorials").glob("*.html"))]
    pages += [f"api/{p.name}" for p in sorted((html / "api").glob("*.html"))]
    skip = {"genindex.html", "search.html", "py-modindex.html"}
    return [page for page in pages if page not in skip]


def test_pages_render_in_a_browser(docs_build, browser):
    html = docs_build.html
    assert (html / "index.html").exists(), "the documentation did not build (see test_docs)"
    pages = _pages(html)
    missing = [page for page in REQUIRED if page not in pages]
    assert not missing, f"pages the browser test must check are not in the build: {missing}"
    problems, typeset = [], 0
    start = time.perf_counter()
    for page in pages:
        browser.get((html / page).as_uri())
        state = browser.execute_async_script(WAIT_FOR_MATH)
        if state == "typeset":
            typeset += 1
        elif state != "no math":
            problems.append(f"{page}: {state}")
        width = browser.execute_script("return document.documentElement.clientWidth")
        assert width > WIDTH - 40, f"the window is {width} px wide, not {WIDTH}"
        problems += [f"{page}: {problem}" for problem in browser.execute_script(CHECK)]
    print(f"{len(pages)} pages checked in {time.perf_counter() - start:.1f} s, {typeset} with math")
    assert typeset > 0, "no page had math typeset: the check of math would not catch anything"
    summary = f"{len(problems)} problems a reader would see at {WIDTH} px:\n"
    assert not problems, summary + "\n".join(problems[:80])


def test_the_check_can_fail(browser, tmp_path):
    """A clipped table, a spilling line, a box wider than the column and raw LaTeX all fail."""
    page = tmp_path / "bad.html"
    page.write_text(
        "<html><body><article style='width:600px'>"
        "<div style='overflow:hidden;width:200px'><table><tr><td style='white-space:nowrap'>"
        + "wide "
        * 80
        + "</td></tr></table></div>"
        "<pre style='overflow:visible;white-space:pre'>" + "x" * 400 + "</pre>"
        "<div style='width:900px'>a box wider than the column</div>"
        "<p><span class='math'>\\(x^2\\)</span></p>"
        "</article></body></html>",
        encoding="utf-8",
    )
    browser.get(page.as_uri())
    problems = browser.execute_script(CHECK)
    text = "\n".join(problems)
    assert "is cut off" in text, text
    assert "runs 300 px past the content column" in text, text  # the wide box
    assert "its text runs" in text, text  # the long line of the <pre>
    assert "math left unrendered" in text and "no MathJax loaded" in text, text
    assert "raw LaTeX" in text, text
