#!/usr/bin/env python3
"""Browser test of the static HTML site that ``bash ci/build-html`` writes to build/html/.

    python ci/test-html.py                      # every page
    python ci/test-html.py --pages 01_profiling # some chapters only
    python ci/test-html.py --site DIR --chromium /path/to/chromium

Serves the site on 127.0.0.1 (http.server in a thread) and loads each page in headless
Chromium through playwright (the system browser: no playwright browser download). Every
request to another host is blocked and counted as a failure, so the site must be self-contained
(as it must be read offline or in CI without internet). For each chapter page it checks

* no console error and no uncaught page error (a failed or blocked resource load is one);
* every plotly figure rendered: the page has as many ``.plotly-graph-div`` as the committed
  notebook has figure outputs (text/html with a plotly div), each became a ``.js-plotly-plot``
  with an ``svg.main-svg`` of non-zero size and at least one trace;
* the navigation: the sidebar table of contents links every chapter, and the previous/next
  links walk the landing page and the chapters in order.

The landing page (intro.html) must link every chapter too, and index.html must exist. Exits 1
with one line per failure, 0 when all pages pass.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LANDING = "intro"


def chapters(book: Path) -> list[str]:
    """The chapter notebooks, in order: NN_name."""
    return sorted(p.stem for p in book.glob("[0-9][0-9]_*.ipynb"))


def expected_figures(nb_path: Path) -> int:
    """Figure outputs in a committed notebook: text/html outputs holding a plotly div."""
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    n = 0
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            html = out.get("data", {}).get("text/html")
            if html is None:
                continue
            html = "".join(html) if isinstance(html, list) else html
            n += html.count('class="plotly-graph-div"')
    return n


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep the test output readable
        pass


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.handle_error = lambda request, client_address: None  # a browser closing early is no failure
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


# Runs in the page: what became of each plotly div.
FIGURES_JS = """() => Array.from(document.querySelectorAll('.plotly-graph-div')).map(d => {
  const svg = d.querySelector('svg.main-svg');
  const box = svg ? svg.getBoundingClientRect() : null;
  return {id: d.id, rendered: d.classList.contains('js-plotly-plot'),
          svgs: d.querySelectorAll('svg.main-svg').length,
          width: box ? box.width : 0, height: box ? box.height : 0,
          traces: Array.isArray(d.data) ? d.data.length : 0};
})"""

WAIT_JS = """n => document.querySelectorAll('.plotly-graph-div').length >= n &&
  Array.from(document.querySelectorAll('.plotly-graph-div')).every(
    d => d.classList.contains('js-plotly-plot') && d.querySelector('svg.main-svg'))"""


def _hrefs(page, selector: str) -> set[str]:
    """The pages (without #anchor) that the links matching ``selector`` point to."""
    hrefs = page.eval_on_selector_all(selector, "els => els.map(e => e.getAttribute('href') || '')")
    return {h.split("#")[0] for h in hrefs}


def check_page(page, base: str, name: str, n_figures: int | None, order: list[str], timeout_ms: int) -> list[str]:
    """Load one page; return its failures (empty when it passes)."""
    problems: list[str] = []
    console: list[str] = []
    errors: list[str] = []
    failed: list[str] = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("requestfailed", lambda r: failed.append(f"{r.url} ({r.failure})"))
    resp = page.goto(base + name + ".html", wait_until="load", timeout=timeout_ms)
    if resp is None or resp.status != 200:
        return [f"{name}.html: HTTP {resp.status if resp else 'no response'}"]
    if n_figures:
        try:
            page.wait_for_function(WAIT_JS, arg=n_figures, timeout=timeout_ms)
        except Exception:  # reported in detail below
            pass
    page.wait_for_timeout(200)  # let late errors (e.g. of a resize) arrive
    problems += [f"console error: {t}" for t in console]
    problems += [f"page error: {t}" for t in errors]
    problems += [f"request failed: {t}" for t in failed]

    if n_figures is not None:
        figs = page.evaluate(FIGURES_JS)
        if len(figs) != n_figures:
            problems.append(f"{len(figs)} plotly figure divs on the page, the notebook has {n_figures} figures")
        for f in figs:
            if not f["rendered"] or f["svgs"] == 0:
                problems.append(f"figure #{f['id']} did not render (no .js-plotly-plot / svg.main-svg)")
            elif f["width"] < 50 or f["height"] < 50:
                problems.append(f"figure #{f['id']} rendered at {f['width']:.0f}x{f['height']:.0f} px")
            elif f["traces"] == 0:
                problems.append(f"figure #{f['id']} has no traces")

    # Navigation: the sidebar lists every chapter; previous/next follow the book's order.
    hrefs = _hrefs(page, "nav.bd-docs-nav a.reference.internal")
    # The current page may link itself as "#" or as its own file.
    missing = [c for c in order[1:] if c + ".html" not in hrefs and c != name]
    if missing:
        problems.append(f"sidebar table of contents lacks {', '.join(missing)}")
    i = order.index(name)
    for sel, j in (("a.left-prev", i - 1), ("a.right-next", i + 1)):
        el = page.query_selector(sel)
        want = order[j] + ".html" if 0 <= j < len(order) else None
        got = el.get_attribute("href").split("#")[0] if el else None
        if got != want:
            problems.append(f"{sel} links {got!r}, expected {want!r}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--site", type=Path, default=ROOT / "build" / "html")
    ap.add_argument("--book", type=Path, default=ROOT / "book")
    ap.add_argument("--chromium", default=os.environ.get("FTLIB_CHROMIUM", "/usr/bin/chromium"))
    ap.add_argument("--pages", nargs="*", help="chapter names (or prefixes such as 01) to test; default all")
    ap.add_argument("--timeout-s", type=float, default=30.0)
    args = ap.parse_args()

    site: Path = args.site
    if not (site / "index.html").is_file():
        print(f"test-html: no site at {site} (run: bash ci/build-html)")
        return 1
    if not Path(args.chromium).exists():
        print(f"test-html: no Chromium at {args.chromium} (apt-get install -y chromium, or --chromium)")
        return 1
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("test-html: playwright is missing (pip install -r ci/requirements-html.txt)")
        return 1

    order = [LANDING, *chapters(args.book)]
    if len(order) == 1:
        print(f"test-html: no chapter notebooks in {args.book}")
        return 1
    pages = order
    if args.pages:
        pages = [p for p in order if any(p.startswith(w) for w in args.pages)]
        if not pages:
            print(f"test-html: no page matches {args.pages}")
            return 1

    failures: list[str] = []
    server, base = serve(site)
    external: list[str] = []
    t0 = time.monotonic()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS, headless=True)
            ctx = browser.new_context(viewport={"width": 1280, "height": 900})

            def route(r):
                if urlparse(r.request.url).hostname == "127.0.0.1":
                    r.continue_()
                else:
                    external.append(r.request.url)
                    r.abort()

            ctx.route("**/*", route)
            for name in pages:
                n_fig = None if name == LANDING else expected_figures(args.book / f"{name}.ipynb")
                before = len(external)
                page = ctx.new_page()
                t = time.monotonic()
                try:
                    probs = check_page(page, base, name, n_fig, order, int(args.timeout_s * 1000))
                except Exception as e:  # a timeout or a crash of the page is a failure, not a traceback
                    probs = [f"{type(e).__name__}: {e}".splitlines()[0]]
                if name == LANDING:
                    links = _hrefs(page, "article a.reference.internal")
                    lacking = [c for c in order[1:] if c + ".html" not in links]
                    if lacking:
                        probs.append(f"the landing page's chapter list lacks {', '.join(lacking)}")
                probs += [f"external request blocked: {u}" for u in external[before:]]
                page.close()
                figs = "" if n_fig is None else f", {n_fig} figures"
                status = "ok" if not probs else "FAIL"
                print(f"{status:4} {name}.html ({time.monotonic() - t:.1f} s{figs})")
                for p in probs:
                    print(f"     - {p}")
                failures += [f"{name}.html: {p}" for p in probs]
            if not args.pages:
                page = ctx.new_page()
                resp = page.goto(base + "index.html", wait_until="load")
                if resp is None or resp.status != 200:
                    failures.append("index.html: missing")
                page.close()
            browser.close()
    finally:
        server.shutdown()
    print(f"test-html: {len(pages)} pages in {time.monotonic() - t0:.1f} s, {len(failures)} failures")
    if failures:
        print("test-html: FAILED")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
