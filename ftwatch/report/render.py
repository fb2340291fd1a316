"""``ftwatch report``: one self-contained HTML page (SPEC E4).

The page is rendered with Jinja2 from ``templates/report.html.j2``; the report's data goes in
as JSON and the plot library (Chart.js, vendored under ``static/``, see its README) is inlined,
so the file needs no network and no other file.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from ftwatch.events import iso
from ftwatch.report import model

HERE = Path(__file__).parent
CHART_JS = HERE / "static" / "chart.umd.min.js"
TEMPLATE = "report.html.j2"
_SOURCE_MAP = re.compile(r"^\s*//[#@]\s*sourceMappingURL=\S*\s*$", re.M)   # would make dev tools fetch a .map


def _environment() -> Environment:
    return Environment(loader=FileSystemLoader(str(HERE / "templates")), undefined=StrictUndefined,
                       autoescape=select_autoescape(["html", "j2"], default=True))


def render_html(data: dict[str, Any], generated: float | None = None,
                signatures: list[dict[str, Any]] | None = None) -> str:
    """The page for ``data`` (``ftwatch.report.model.build``'s result) as one HTML string, with
    ``signatures`` (``model.signature_rows``) in its "Failure signatures" section.

    Raises:
        OSError: the vendored ``static/chart.umd.min.js`` is missing (a broken install).
    """
    script = _SOURCE_MAP.sub("", CHART_JS.read_text(encoding="utf-8"))
    if "</script" in script.lower():     # would end the inline <script> early
        raise ValueError(f"{CHART_JS} contains '</script'; it cannot be inlined")
    return _environment().get_template(TEMPLATE).render(
        data=data, signatures=list(signatures or []), chart_js=Markup(script),
        generated=iso(generated if generated is not None else time.time()))


def write_report(reader: Any, out: Path, jobs: list[str] | None = None,
                 signatures: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Build the report from ``reader`` (a ``ReportReader``) and write it to ``out`` atomically;
    ``signatures`` (``model.signature_rows``) fill its "Failure signatures" section.

    Returns:
        the data plotted (``model.build``'s result).

    Raises:
        LookupError: a job in ``jobs`` is not in the store.
        OSError: ``out`` cannot be written.
    """
    data = model.build(reader, jobs)
    html = render_html(data, signatures=signatures)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(html)
            os.fchmod(fh.fileno(), 0o644)     # mkstemp's 0600 would hide the page from others
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return data
