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
* every figure's axes are sane (:func:`axis_problems`): a log axis spans at most
  ``MAX_DECADES`` decades, a linear one at most ``MAX_SPAN_RATIO`` times the span of its data
  (an annotation or shape placed in the wrong units stretches an axis far past its points);
* every table rendered as a table: the page has at least as many ``<table>`` elements as the
  notebook's outputs hold (collapsed ones count), and no Markdown table is left as text (a
  paragraph or output of ``| a | b |`` and ``|---|`` lines);
* no test marker (``# NBVAL_IGNORE_OUTPUT``, an ``nbval-...`` tag) in the text a reader sees;
* no broken internal link: every link (and image) to a page or file of the site resolves, and
  its ``#anchor`` exists on the target page;
* the navigation: the sidebar table of contents links every chapter, and the previous/next
  links walk the landing page and the chapters in order.

The landing page (intro.html) must link every chapter too, and index.html must exist. A
full-page screenshot of every page, 1280 px wide, goes to ``--screens`` (default
build/html-screens/) for a human look. Exits 1 with one line per failure, 0 when all pages pass.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import math
import os
import re
import sys
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

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
MAX_DECADES = 12  # a log axis wider than this is an axis gone wrong, not data
MAX_SPAN_RATIO = 1000  # a linear axis this many times wider than its data's span likewise


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


def expected_tables(nb_path: Path) -> int:
    """HTML tables in a committed notebook's outputs (text/html, the representation the site shows)."""
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    n = 0
    for cell in nb.get("cells", []):
        if "remove-output" in cell.get("metadata", {}).get("tags", []) or "remove-cell" in cell.get(
                "metadata", {}).get("tags", []):
            continue
        for out in cell.get("outputs", []):
            html = out.get("data", {}).get("text/html")
            if html is not None:
                n += len(re.findall(r"<table\b", "".join(html) if isinstance(html, list) else html))
    return n


def axis_problems(axes: list[dict]) -> list[str]:
    """Axes of one figure whose range is absurd for their data.

    Each axis is ``{"name", "type", "range", "min", "max"}`` (``range`` as plotly keeps it: log10
    units on a log axis; ``min``/``max`` of the numeric data on it, None without any). A log axis
    may span at most MAX_DECADES decades; a linear one at most MAX_SPAN_RATIO times its data's
    span (or its largest magnitude, for data of one value).
    """
    out = []
    for a in axes:
        rng = a.get("range")
        if a.get("type") not in ("log", "linear") or not rng or len(rng) != 2:
            continue
        try:
            lo, hi = float(rng[0]), float(rng[1])
        except (TypeError, ValueError):
            continue
        if not (math.isfinite(lo) and math.isfinite(hi)):
            out.append(f"{a['name']} has a non-finite range {rng}")
            continue
        width = abs(hi - lo)
        if a["type"] == "log":
            if width > MAX_DECADES:
                out.append(f"{a['name']} (log) spans {width:.0f} decades (10^{min(lo, hi):.0f} to "
                           f"10^{max(lo, hi):.0f}); more than {MAX_DECADES} means an axis gone wrong")
        elif a.get("min") is not None and a.get("max") is not None:
            scale = max(a["max"] - a["min"], abs(a["max"]), abs(a["min"]))
            if scale > 0 and width > MAX_SPAN_RATIO * scale:
                out.append(f"{a['name']} spans {lo:.3g} to {hi:.3g}, {width / scale:.0f}x its data "
                           f"({a['min']:.3g} to {a['max']:.3g})")
    return out


def link_problems(site: Path, page: str, links: list[str], base: str) -> list[str]:
    """Links (hrefs and image sources, as written) of ``page`` that point into the site and do
    not resolve: a missing file, or an ``#anchor`` that no element of the target carries."""
    out = []
    here = urljoin(base, page)
    ids: dict[Path, set[str]] = {}
    for link in dict.fromkeys(links):
        if not link or link.startswith(("mailto:", "javascript:", "data:", "tel:")):
            continue
        url = urlparse(urljoin(here, link))
        if url.scheme not in ("http", "https") or url.netloc != urlparse(base).netloc:
            continue  # external: not the site's business here (blocked and reported when requested)
        rel = unquote(url.path)[len(urlparse(base).path):]
        target = site / rel
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file():
            out.append(f"broken link {link!r}: no {target.relative_to(site)}")
            continue
        if url.fragment and target.suffix == ".html":
            if target not in ids:
                text = target.read_text(encoding="utf-8", errors="replace")
                ids[target] = set(re.findall(r'\b(?:id|name)="([^"]+)"', text))
            if unquote(url.fragment) not in ids[target]:
                out.append(f"broken link {link!r}: no #{url.fragment} in {target.relative_to(site)}")
    return out


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

# Runs in the page: each figure's axes with their range and the span of the data on them.
AXES_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(d => {
  const fl = d._fullLayout || {};
  const data = {};
  const num = v => (typeof v === 'number' && isFinite(v)) ? v : null;
  for (const t of (d._fullData || [])) {
    if (t.visible === false) continue;
    for (const [k, ax] of [['x', t.xaxis || 'x'], ['y', t.yaxis || 'y']]) {
      const vals = Array.from(t[k] || []).map(num).filter(v => v !== null);
      if (t.type === 'bar' && ((k === 'y') === (t.orientation !== 'h'))) vals.push(0);
      if (!vals.length) continue;
      const key = ax.replace(/^x/, 'xaxis').replace(/^y/, 'yaxis');
      const cur = data[key] || {min: Infinity, max: -Infinity};
      for (const v of vals) { cur.min = Math.min(cur.min, v); cur.max = Math.max(cur.max, v); }
      data[key] = cur;
    }
  }
  const axes = Object.keys(fl).filter(k => /^[xy]axis\\d*$/.test(k)).map(k => {
    const a = fl[k];
    const dd = data[k];
    return {name: k, type: a.type, range: a.range ? Array.from(a.range) : null,
            min: dd ? dd.min : null, max: dd ? dd.max : null};
  });
  return {id: d.id, axes: axes};
})"""

# Runs in the page: tables, Markdown tables left as text, and every link and image source.
CONTENT_JS = """() => {
  const main = document.querySelector('article') || document.body;
  // A separator row "|---|---|" (typography may have turned "---" into a dash) or, in a paragraph,
  // several lines that start and end with "|".
  const sep = /^\\s*\\|[\\s|:\\-\u2013\u2014]*[\\-\u2013\u2014][\\s|:\\-\u2013\u2014]*$/m;
  const rows = /^\\s*\\|.*\\|\\s*$/gm;
  const text = Array.from(main.querySelectorAll('p, .cell_output pre, .output pre'))
    .filter(e => sep.test(e.textContent) || (e.tagName === 'P' && (e.textContent.match(rows) || []).length >= 2))
    .map(e => e.textContent.trim().slice(0, 70));
  const links = Array.from(document.querySelectorAll('a[href]')).map(a => a.getAttribute('href'))
    .concat(Array.from(document.querySelectorAll('img[src]')).map(i => i.getAttribute('src')));
  const markers = Array.from(new Set(main.textContent.match(/NBVAL_[A-Z_]+|nbval-[a-z-]+/g) || []));
  return {tables: main.querySelectorAll('table').length, pipe_text: text, links: links, markers: markers};
}"""

WAIT_JS = """n => document.querySelectorAll('.plotly-graph-div').length >= n &&
  Array.from(document.querySelectorAll('.plotly-graph-div')).every(
    d => d.classList.contains('js-plotly-plot') && d.querySelector('svg.main-svg'))"""


def _hrefs(page, selector: str) -> set[str]:
    """The pages (without #anchor) that the links matching ``selector`` point to."""
    hrefs = page.eval_on_selector_all(selector, "els => els.map(e => e.getAttribute('href') || '')")
    return {h.split("#")[0] for h in hrefs}


def check_page(page, base: str, name: str, n_figures: int | None, order: list[str], timeout_ms: int,
               site: Path | None = None, n_tables: int | None = None, screens: Path | None = None) -> list[str]:
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
        for f in page.evaluate(AXES_JS):
            problems += [f"figure #{f['id']}: {p}" for p in axis_problems(f["axes"])]

    content = page.evaluate(CONTENT_JS)
    if n_tables is not None and content["tables"] < n_tables:
        problems.append(f"{content['tables']} HTML tables on the page, the notebook's outputs hold {n_tables}")
    problems += [f"a Markdown table left as text: {t!r}" for t in content["pipe_text"]]
    problems += [f"a test marker shown to readers: {m}" for m in content["markers"]]
    if site is not None:
        problems += link_problems(site, name + ".html", content["links"], base)
    if screens is not None:
        page.set_viewport_size({"width": 1280, "height": 900})
        page.screenshot(path=str(screens / f"{name}.png"), full_page=True)

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
    ap.add_argument("--screens", type=Path, default=ROOT / "build" / "html-screens",
                    help="folder for a full-page screenshot of every page (1280 px wide)")
    ap.add_argument("--no-screens", action="store_true", help="take no screenshots")
    args = ap.parse_args()
    screens = None if args.no_screens else args.screens
    if screens is not None:
        screens.mkdir(parents=True, exist_ok=True)

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
                n_tab = None if name == LANDING else expected_tables(args.book / f"{name}.ipynb")
                before = len(external)
                page = ctx.new_page()
                t = time.monotonic()
                try:
                    probs = check_page(page, base, name, n_fig, order, int(args.timeout_s * 1000), site=site,
                                       n_tables=n_tab, screens=screens)
                except Exception as e:  # a timeout or a crash of the page is a failure, not a traceback
                    probs = [f"{type(e).__name__}: {e}".splitlines()[0]]
                if name == LANDING:
                    links = _hrefs(page, "article a.reference.internal")
                    lacking = [c for c in order[1:] if c + ".html" not in links]
                    if lacking:
                        probs.append(f"the landing page's chapter list lacks {', '.join(lacking)}")
                probs += [f"external request blocked: {u}" for u in external[before:]]
                page.close()
                figs = "" if n_fig is None else f", {n_fig} figures, {n_tab} tables"
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
    print(f"test-html: {len(pages)} pages in {time.monotonic() - t0:.1f} s, {len(failures)} failures"
          + (f"; screenshots in {screens}" if screens is not None else ""))
    if failures:
        print("test-html: FAILED")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
