"""The docs site: it builds with `mkdocs build --strict`, has a page for every lesson and engine
module, loads nothing from the network, and renders in a real browser.

The build reads the lessons' cached runs (build/lessons/, made by tests/test_lessons.py earlier in
the same session, or by the build itself), so no lesson runs twice.

The browser check serves the built site on localhost and opens pages in headless Chromium driven
through the DevTools protocol: each page must show its title, load every image, render its
mermaid diagrams, log no console error, and request nothing from another host. Screenshots go to
build/screenshots/ (MINIVLLM_SCREENSHOTS overrides), for a person to look at after CI.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

import lesson_runner

REPO = lesson_runner.REPO
SITE_DIR = REPO / "build" / "site"
SCREENSHOTS = Path(os.environ.get("MINIVLLM_SCREENSHOTS", REPO / "build" / "screenshots"))
LESSONS = lesson_runner.discover_lessons()
STATIC_PAGES = ["index", "lessons/index", "catalog", "glossary", "guide", "benchmarks", "api/index"]
BROWSER_PAGES = STATIC_PAGES[:1] + [f"lessons/{p.stem}" for p in LESSONS] + STATIC_PAGES[1:]


def _engine_modules() -> list[str]:
    mods = []
    for package in ("minivllm", "kernels"):
        for f in sorted((REPO / package).rglob("*.py")) if (REPO / package).is_dir() else []:
            if f.name == "__init__.py" or not f.read_text(encoding="utf-8").strip():
                continue
            mods.append(".".join(f.relative_to(REPO).with_suffix("").parts))
    return mods


# ----------------------------------------------------------------------------- the build


@pytest.fixture(scope="session")
def built_site() -> Path:
    """`mkdocs build --strict` into build/site; fails with mkdocs' own output."""
    if SITE_DIR.exists():
        shutil.rmtree(SITE_DIR)
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(SITE_DIR)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1800,
    )
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    print(f"\nsite built in {seconds:.1f} s: {len(list(SITE_DIR.rglob('*.html')))} pages")
    return SITE_DIR


def test_site_has_every_page(built_site):
    for page in STATIC_PAGES:
        assert (built_site / f"{page}.html").is_file(), f"missing page {page}"
    for lesson in LESSONS:
        html = (built_site / "lessons" / f"{lesson.stem}.html").read_text(encoding="utf-8")
        assert f"uv run marimo edit lessons/{lesson.name}" in html
    for module in _engine_modules():
        html = (built_site / "api" / f"{module}.html").read_text(encoding="utf-8")
        assert 'class="doc doc-' in html, f"api/{module}: mkdocstrings rendered nothing"
    home = (built_site / "index.html").read_text(encoding="utf-8")
    for lesson in LESSONS:
        assert f"lessons/{lesson.stem}.html" in home, f"the home page does not link {lesson.name}"
    # Lessons renumbered when the capstone moved last: the old addresses send readers on.
    for old, new in {"17_capstone": "19_capstone", "18_simulation": "17_simulation",
                     "19_scaling_out": "18_scaling_out"}.items():
        stub = (built_site / "lessons" / f"{old}.html").read_text(encoding="utf-8")
        assert f'url={new}.html"' in stub and (built_site / "lessons" / f"{new}.html").is_file()


@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_page_shows_its_run(built_site, lesson):
    """The page carries the run's printed findings and every figure the notebook drew."""
    # The run the build just used (read from the cache, never re-run here).
    run = lesson_runner.run_lesson(lesson, execute=False)
    assert run is not None, f"the build left no run of {lesson.name} in {lesson_runner.CACHE_DIR}"
    html = (built_site / "lessons" / f"{lesson.stem}.html").read_text(encoding="utf-8")
    for fig in run.figures():
        served = built_site / "lessons" / "figures" / lesson.stem / fig.name
        assert served.read_bytes() == fig.read_bytes(), f"{fig.name} missing from the site"
        assert f"figures/{lesson.stem}/{fig.name}" in html
    printed = [ln.strip() for ln in run.stdout.splitlines() if len(ln.strip()) > 8]
    if printed:
        import html as html_lib

        text = html_lib.unescape(re.sub(r"<[^>]+>", "", html))
        assert printed[0] in text, f"the page lacks the printed line {printed[0]!r}"


def test_catalog_shows_the_ladder_and_the_glossary_defines_its_terms(built_site):
    """The catalog's Part I rows come from lesson 19's ablation ladder, every page carries the
    glossary's abbreviations (shown on hover), and the GPU column says what it holds."""
    catalog = (built_site / "catalog.html").read_text(encoding="utf-8")
    assert catalog.count("lesson 19's ladder") == 4 and "did not record" not in catalog
    assert "On a GPU" in catalog
    glossary = (built_site / "glossary.html").read_text(encoding="utf-8")
    for term in ("TTFT", "ITL", "TPOT", "E2E", "SLO"):
        assert f">{term}</abbr>" in glossary, term
    page = (built_site / "lessons" / "19_capstone.html").read_text(encoding="utf-8")
    assert ">TTFT</abbr>" in page and 'id="findings-of-this-run"' in page


def test_site_loads_nothing_from_the_network(built_site):
    """No script, stylesheet, image or font from another host: the site reads offline."""
    pattern = re.compile(
        r"""<(?:script|img|iframe|source)\b[^>]*\bsrc=["'](https?:)?//|"""
        r"""<link\b[^>]*rel=["'](?:stylesheet|preload|modulepreload|icon)["'][^>]*href=["'](https?:)?//"""
    )
    offenders = []
    for page in built_site.rglob("*.html"):
        for m in pattern.finditer(page.read_text(encoding="utf-8")):
            offenders.append(f"{page.relative_to(built_site)}: {m.group(0)[:120]}")
    assert not offenders, "external resources:\n" + "\n".join(offenders[:20])


# ----------------------------------------------------------------------------- the browser

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--window-size=1280,900",
    "--remote-debugging-port=0",
    "about:blank",
]


def _find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    return None


class DevTools:
    """A minimal Chrome DevTools Protocol client: one browser, flat sessions per tab."""

    def __init__(self, executable: str):
        from websockets.sync.client import connect

        self.profile = tempfile.mkdtemp(prefix="minivllm-chromium-")
        self.proc = subprocess.Popen(
            [executable, *CHROMIUM_FLAGS[:-1], f"--user-data-dir={self.profile}", CHROMIUM_FLAGS[-1]],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                self.close()
                raise RuntimeError(f"Chromium did not start:\n{err[-2000:]}")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/version", timeout=10) as r:
            ws_url = json.load(r)["webSocketDebuggerUrl"]
        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(connect(ws_url, max_size=2**28, open_timeout=10))
        self.next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while True:
            reply = json.loads(self.ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_for(self, method: str, session: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        for ev in self.events:
            if ev["method"] == method and ev.get("sessionId") == session:
                return ev
        while True:
            ev = json.loads(self.ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if "method" in ev:
                self.events.append(ev)
                if ev["method"] == method and ev.get("sessionId") == session:
                    return ev

    def evaluate(self, expression: str, session: str):
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True}, session)
        if "exceptionDetails" in res:
            raise RuntimeError(f"evaluate failed: {res['exceptionDetails']}")
        return res["result"].get("value")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._stack.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest's output clean
        pass


@pytest.fixture(scope="session")
def site_server(built_site):
    handler = functools.partial(_QuietHandler, directory=str(built_site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def browser():
    exe = _find_chromium()
    if exe is None:
        pytest.skip(
            "BROWSER CHECK SKIPPED: no Chromium on this machine (.ci/run installs Debian's "
            "chromium; run `apt-get install -y chromium` to enable the check)"
        )
    devtools = DevTools(exe)
    yield devtools
    devtools.close()


# Runs in the page once it has loaded: title, heading, images, mermaid diagrams.
PAGE_STATE_JS = """
(async () => {
  const deadline = Date.now() + 10000;
  // Material swaps each <pre class="mermaid"> for a <div class="mermaid"> holding the SVG
  // (in a closed shadow root), so a diagram is drawn once its <pre> is gone and it has a size.
  const pending = () => [...document.querySelectorAll('.mermaid')]
      .filter(el => el.tagName === 'PRE' || el.getBoundingClientRect().height < 20);
  while (pending().length && Date.now() < deadline) await new Promise(r => setTimeout(r, 100));
  await Promise.all([...document.images].map(img => img.complete ? null :
      new Promise(r => { img.onload = img.onerror = r; setTimeout(r, 5000); })));
  const h1 = document.querySelector('article h1, .md-content h1');
  const box = h1 ? h1.getBoundingClientRect() : null;
  return {
    title: document.title,
    h1: h1 ? h1.textContent.replace(/\\u00b6$/, '').trim() : null,
    h1Visible: !!box && box.width > 0 && box.height > 0,
    images: [...document.images].map(i => ({src: i.currentSrc || i.src, ok: i.complete && i.naturalWidth > 0})),
    mermaid: document.querySelectorAll('.mermaid').length,
    copyButtons: document.querySelectorAll('button.md-clipboard, button.md-code__button[data-md-type="copy"]').length,
    codeBlocks: document.querySelectorAll('.md-content pre > code').length,
    paletteToggle: document.querySelectorAll('[data-md-component="palette"] input').length,
    mermaidPending: pending().length,
    height: Math.ceil(document.documentElement.scrollHeight),
  };
})()
"""


def _problems(events: list[dict], session: str, origin: str) -> list[str]:
    """Console errors, uncaught exceptions, failed loads, and requests to other hosts."""
    out = []
    for ev in events:
        if ev.get("sessionId") != session:
            continue
        method, p = ev["method"], ev.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            out.append(f"console.{p['type']}: {args[:300]}")
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append(f"uncaught: {d.get('exception', {}).get('description', d.get('text'))}"[:400])
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            e = p["entry"]
            out.append(f"log error: {e.get('text')} {e.get('url', '')}"[:400])
        elif method == "Network.loadingFailed" and not p.get("canceled"):
            out.append(f"failed to load: {p.get('errorText')} ({p.get('type')})")
        elif method == "Network.responseReceived" and p["response"]["status"] >= 400:
            out.append(f"HTTP {p['response']['status']}: {p['response']['url']}")
        elif method == "Network.requestWillBeSent":
            url = p["request"]["url"]
            if url.startswith(("http:", "https:", "ws:", "wss:")) and not url.startswith(origin):
                out.append(f"network request to another host: {url}")
    return out


def _open(browser: DevTools, url: str, origin: str, shot: Path,
          full_page: bool = True) -> tuple[dict, list[str]]:
    """Load `url` in a new tab: the page's state (PAGE_STATE_JS), a screenshot (the whole
    page up to 12,000 px, or its first screen), and what went wrong on the way."""
    target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    try:
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.send(f"{domain}.enable", session=session)
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
                     session=session)
        browser.send("Page.navigate", {"url": url}, session=session)
        browser.wait_for("Page.loadEventFired", session)
        state = browser.evaluate(PAGE_STATE_JS, session)
        if full_page:
            height = min(max(900, state["height"]), 12000)
            browser.send("Emulation.setDeviceMetricsOverride",
                         {"width": 1280, "height": height, "deviceScaleFactor": 1,
                          "mobile": False}, session=session)
        png = browser.send("Page.captureScreenshot", {"format": "png"}, session=session)["data"]
        shot.parent.mkdir(parents=True, exist_ok=True)
        shot.write_bytes(base64.b64decode(png))
        time.sleep(0.2)  # let late console messages arrive
        browser.send("Runtime.evaluate", {"expression": "1"}, session=session)
        return state, _problems(browser.events, session, origin)
    finally:
        browser.send("Target.closeTarget", {"targetId": target})


@pytest.mark.parametrize("page", BROWSER_PAGES)
def test_page_renders_in_chromium(page, browser, site_server):
    shot = SCREENSHOTS / f"{page.replace('/', '__')}.png"
    state, problems = _open(browser, f"{site_server}/{page}.html", site_server, shot)
    assert state["title"].strip() and state["h1"] and state["h1Visible"], (
        f"{page}: no visible title (title={state['title']!r}, h1={state['h1']!r})"
    )
    broken = [i["src"] for i in state["images"] if not i["ok"]]
    assert not broken, f"{page}: broken images: {broken}"
    assert not state["mermaidPending"], f"{page}: {state['mermaidPending']} mermaid diagrams did not render"
    assert not problems, f"{page}:\n" + "\n".join(problems)
    assert state["paletteToggle"] >= 2, f"{page}: no light/dark toggle"
    if state["codeBlocks"]:
        assert state["copyButtons"] >= state["codeBlocks"] - state["mermaid"], (
            f"{page}: code blocks without a copy button"
        )
    if page.startswith("lessons/") and page != "lessons/index":
        stem = page.split("/")[1]
        run = lesson_runner.run_lesson(lesson_runner.LESSONS_DIR / f"{stem}.py", execute=False)
        if run is not None:
            assert len(state["images"]) >= len(run.figures()), f"{page}: figures missing"
    if page == "guide":
        assert state["mermaid"] >= 1, "the engine guide's data-path diagram is missing"


def test_api_pages_render_in_chromium(browser, site_server):
    """Every module's reference page loads with its title and nothing broken. Their shots are
    the first screen: ~150 pages of source listings, whole, took most of this test's minutes."""
    failures = []
    for module in _engine_modules():
        page = f"api/{module}"
        state, problems = _open(browser, f"{site_server}/{page}.html", site_server,
                                SCREENSHOTS / f"{page.replace('/', '__')}.png", full_page=False)
        if not state["h1"] or problems:
            failures.append(f"{page}: h1={state['h1']!r} {problems}")
    assert not failures, "\n".join(failures)


def test_search_works_in_chromium(browser, site_server):
    """Material's search (a web worker over search/search_index.json) finds the scheduler."""
    target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    try:
        browser.send("Page.enable", session=session)
        browser.send("Page.navigate", {"url": f"{site_server}/index.html"}, session=session)
        browser.wait_for("Page.loadEventFired", session)
        found = browser.evaluate("""
        (async () => {
          const input = document.querySelector('input.md-search__input');
          input.focus();
          input.value = 'scheduler';
          input.dispatchEvent(new Event('input', {bubbles: true}));
          input.dispatchEvent(new KeyboardEvent('keyup', {bubbles: true}));
          const deadline = Date.now() + 10000;
          const items = () => document.querySelectorAll('.md-search-result__item').length;
          while (!items() && Date.now() < deadline) await new Promise(r => setTimeout(r, 100));
          return items();
        })()""", session)
    finally:
        browser.send("Target.closeTarget", {"targetId": target})
    assert found > 0, "search for 'scheduler' returned nothing"
