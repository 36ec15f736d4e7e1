"""Sphinx extension for the book's HTML site (bash ci/build-html): a site that works offline.

``ftlib.views.plots.show`` emits each figure's ``text/html`` with plotly's
``to_html(include_plotlyjs="cdn")``: a ``<script src="https://cdn.plot.ly/plotly-X.min.js"
integrity=...>`` tag before the figure's div. A site read offline (or tested in a browser
without internet) cannot load that, so this extension

* copies the ``plotly.min.js`` bundled inside the installed ``plotly`` package to
  ``_static/plotly.min.js`` of the HTML output;
* rewrites the raw HTML outputs of every page: the first CDN tag on a page becomes
  ``<script src="<relative>/_static/plotly.min.js">`` (its ``integrity`` hash, computed for
  the CDN file, is dropped) and later ones on the same page are removed (plotly.js is then
  already loaded: the scripts run in document order). A figure that names another plotly.js
  version than the bundled one fails the build, since its JSON was written for that version;
* shows each chapter's "Open in Colab" badge as a plain link text "Open in Colab" (the badge
  image lives on colab.research.google.com; the theme's launch button links Colab as well);
* drops duplicate ``<script>`` entries from the page head (sphinx-thebe 0.3.1 under Sphinx 7.4
  registers its inline ``const THEBE_JS_URL = ...`` twice, a SyntaxError in the browser).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from docutils import nodes
from sphinx.util import logging
from sphinx.util.osutil import relative_uri

logger = logging.getLogger(__name__)

CDN_TAG = re.compile(
    r'<script\b[^>]*\bsrc="https://cdn\.plot\.ly/plotly-(?P<ver>[0-9][^"]*?)\.min\.js"[^>]*>\s*</script>'
)
LOCAL = "_static/plotly.min.js"
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"


def _bundled() -> Path:
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def _bundled_version() -> str:
    head = _bundled().read_text(encoding="utf-8", errors="replace")[:400]
    m = re.search(r"plotly\.js v([0-9][^\s*]*)", head)
    return m.group(1) if m else "unknown"


def _local_plotly(app, doctree: nodes.document, docname: str) -> None:
    src = relative_uri(app.builder.get_target_uri(docname), LOCAL)
    have = _bundled_version()
    loaded = False
    for node in list(doctree.findall(nodes.raw)):
        if "html" not in node.get("format", "").split() or "cdn.plot.ly" not in node.astext():
            continue

        def sub(m: re.Match) -> str:
            nonlocal loaded
            if m.group("ver") != have:
                raise RuntimeError(
                    f"{docname}: a figure wants plotly.js {m.group('ver')} but the installed plotly bundles "
                    f"{have}; install the plotly the notebooks were executed with (ci/requirements-ci.txt)"
                )
            if loaded:
                return ""
            loaded = True
            return f'<script charset="utf-8" src="{src}"></script>'

        new = CDN_TAG.sub(sub, node.astext())
        if "cdn.plot.ly" in new:
            logger.warning("%s: a plotly CDN reference in an unknown form was left in place", docname)
        node.replace_self(nodes.raw("", new, format=node["format"], classes=node.get("classes", [])))


def _colab_badges(doctree: nodes.document) -> None:
    for img in list(doctree.findall(nodes.image)):
        if img.get("uri", "").startswith(COLAB_BADGE):
            img.replace_self(nodes.inline("", img.get("alt") or "Open in Colab", classes=["colab-link"]))


def _doctree_resolved(app, doctree: nodes.document, docname: str) -> None:
    if app.builder.format != "html":
        return
    _local_plotly(app, doctree, docname)
    _colab_badges(doctree)


def _page_context(app, pagename, templatename, context, doctree) -> None:
    scripts = context.get("script_files")
    if scripts:
        seen, unique = set(), []
        for s in scripts:  # the same file or inline body (an inline one has filename None or "")
            key = (str(getattr(s, "filename", s) or ""), tuple(sorted(getattr(s, "attributes", {}).items())))
            if key not in seen:
                seen.add(key)
                unique.append(s)
        context["script_files"] = unique


def _copy(app, exc) -> None:
    if exc is None and app.builder.format == "html":
        dest = Path(app.outdir) / LOCAL
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(_bundled(), dest)


def setup(app):
    app.connect("doctree-resolved", _doctree_resolved)
    app.connect("html-page-context", _page_context, priority=900)  # after the handlers that add scripts
    app.connect("build-finished", _copy)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
