"""The HTML site: ``bash ci/build-html`` builds it and ``ci/test-html.py`` checks it in Chromium.

Skipped where there is no Chromium (``/usr/bin/chromium``, or ``FTLIB_CHROMIUM``) or where
``FTLIB_SKIP_HTML`` is set. The second test makes sure the browser check can fail: a copy of the
site without its plotly.js must be reported as figures that did not render.
"""

from __future__ import annotations

import os
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
