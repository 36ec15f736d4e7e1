"""The HTML site: ``bash ci/build-html`` builds it and ``ci/test-html.py`` checks it in Chromium.

Skipped where there is no Chromium (``/usr/bin/chromium``, or ``FTLIB_CHROMIUM``) or where
``FTLIB_SKIP_HTML`` is set. The second test makes sure the browser check can fail: a copy of the
site without its plotly.js must be reported as figures that did not render, and a page broken on
purpose (a table left as Markdown text, a table missing, broken links, absurd axes) as each of those.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "build" / "html"
CHROMIUM = os.environ.get("FTLIB_CHROMIUM", "/usr/bin/chromium")

pytestmark = [
    pytest.mark.skipif(bool(os.environ.get("FTLIB_SKIP_HTML")), reason="FTLIB_SKIP_HTML is set"),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM} (apt-get install -y chromium)"),
]


def _env() -> dict[str, str]:
    """This interpreter's environment for the scripts, so they install into and run from it."""
    env = dict(os.environ)
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def _run(cmd: list[str], timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def site() -> Path:
    r = _run(["bash", "ci/build-html"], timeout=900)
    assert r.returncode == 0, f"ci/build-html failed:\n{r.stdout}\n{r.stderr}"
    return SITE


def test_site_renders_in_chromium(site: Path) -> None:
    r = _run([sys.executable, "ci/test-html.py", "--site", str(site)], timeout=600)
    assert r.returncode == 0, f"ci/test-html.py failed:\n{r.stdout}\n{r.stderr}"
    assert "0 failures" in r.stdout


def test_browser_check_catches_a_figure_that_does_not_render(site: Path, tmp_path: Path) -> None:
    chapters = sorted((ROOT / "book").glob("[0-9][0-9]_*.ipynb"))
    with_figures = [p.stem for p in chapters if "plotly-graph-div" in p.read_text(encoding="utf-8")]
    if not with_figures:
        pytest.skip("no chapter has a plotly figure")
    broken = tmp_path / "html"
    shutil.copytree(site, broken)
    (broken / "_static" / "plotly.min.js").unlink()
    cmd = [sys.executable, "ci/test-html.py", "--site", str(broken), "--pages", with_figures[0], "--timeout-s", "5"]
    r = _run(cmd, timeout=300)
    assert r.returncode != 0, f"a site without plotly.js passed:\n{r.stdout}"
    assert "did not render" in r.stdout and "plotly.min.js" in r.stdout, r.stdout


def test_browser_check_catches_text_tables_missing_tables_broken_links_and_absurd_axes(site: Path, tmp_path: Path):
    page = "02_flop_accounting"
    if not (site / f"{page}.html").exists():
        pytest.skip(f"no {page} in the site")
    broken = tmp_path / "html"
    shutil.copytree(site, broken)
    path = broken / f"{page}.html"
    html = path.read_text(encoding="utf-8")
    # one table fewer than the notebook holds, and a Markdown table left as a paragraph in its place
    html, n = re.subn(r"<table\b.*?</table>", "<p>| a | b |\n|---|---|\n| 1 | 2 |</p>", html, count=1, flags=re.S)
    assert n == 1
    # two broken internal links and a test marker in the text
    inserted = '<a href="no-such-page.html">x</a> <a href="#no-such-anchor">y</a><pre># NBVAL_IGNORE_OUTPUT</pre>'
    html = re.sub(r"(<article\b[^>]*>)", lambda m: m.group(1) + inserted, html, count=1)
    # once the figures are drawn: the first one's y axis over 150 decades, the second's 10^6 times its data
    script = """<script>window.addEventListener('load', () => {
      const [a, b] = document.querySelectorAll('.plotly-graph-div');
      const later = () => (a._fullLayout && b._fullLayout)
        ? (Plotly.relayout(a, {'yaxis.type': 'log', 'yaxis.range': [0, 150]}),
           Plotly.relayout(b, {'yaxis.range': [0, 1e7]}))
        : setTimeout(later, 20);
      later();
    });</script>"""
    html = html.replace("</body>", script + "</body>", 1)
    path.write_text(html, encoding="utf-8")
    cmd = [sys.executable, "ci/test-html.py", "--site", str(broken), "--pages", page, "--no-screens"]
    r = _run(cmd, timeout=300)
    assert r.returncode != 0, f"a broken page passed:\n{r.stdout}"
    for what in ("HTML tables on the page", "a Markdown table left as text", "broken link 'no-such-page.html'",
                 "broken link '#no-such-anchor'", "decades", "its data", "test marker shown to readers"):
        assert what in r.stdout, f"{what!r} not reported:\n{r.stdout}"


def test_screenshots_of_every_page(site: Path, tmp_path: Path):
    shots = tmp_path / "screens"
    cmd = [sys.executable, "ci/test-html.py", "--site", str(site), "--pages", "intro", "07", "--screens", str(shots)]
    r = _run(cmd, timeout=300)
    assert r.returncode == 0, r.stdout
    for name in ("intro", "07_claims"):
        png = shots / f"{name}.png"
        assert png.read_bytes()[:4] == b"\x89PNG"
