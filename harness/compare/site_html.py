"""The results site's HTML: escaping, the page frame with its stylesheet, tables, definition lists,
figures; the stylesheet and the pages' scripts are package data (site_assets/)."""
from __future__ import annotations

import functools
import hashlib
import html
import json
import re
from importlib import resources
from typing import Any, Iterable

from mlharness.compare.report_plots import Plot
from mlharness.tables import format_value


@functools.lru_cache(maxsize=None)
def asset(name: str) -> str:
    """site_assets/NAME: the stylesheet or a page's script, inlined so the site needs no second fetch."""
    return resources.files("mlharness.compare").joinpath("site_assets", name).read_text(encoding="utf-8")


def esc(value: Any) -> str:
    return html.escape(format_value(value) if not isinstance(value, str) else value, quote=True)


def slug(text: str) -> str:
    """A file name for a run or sweep id (ids are already safe; imported records may not be)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("._")[:100]
    if cleaned != str(text):  # keep two ids that clean to the same text apart
        cleaned += "-" + hashlib.sha256(str(text).encode()).hexdigest()[:8]
    return cleaned or "_"


def json_script(element_id: str, data: Any) -> str:
    text = json.dumps(data, sort_keys=True, default=str).replace("</", "<\\/")
    return f"<script type='application/json' id='{element_id}'>{text}</script>"


def page(title: str, body: str, depth: int, script: str = "") -> str:
    up = "../" * depth
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{esc(title)}</title><style>{asset('site.css')}</style></head><body>"
            f"<header><b>mlharness results</b><a href='{up}index.html'>runs</a>"
            f"<a href='{up}index.html#sweeps'>sweeps</a><a href='{up}bricks.html'>bricks</a>"
            f"<a href='{up}compare.html'>compare</a></header>"
            f"<main><h1>{esc(title)}</h1>{body}</main>{script}</body></html>\n")


def table(headers: Iterable[str], rows: Iterable[Iterable[Any]], raw: bool = False) -> str:
    """A table; cells are escaped text, or HTML already when `raw` (callers escape what they put in)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for value in row:
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            text = value if raw and isinstance(value, str) else esc(value)
            cells.append(f"<td class='n'>{text}</td>" if numeric else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def definitions(pairs: Iterable[tuple[str, Any]]) -> str:
    return "<dl>" + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in pairs) + "</dl>"


def figures_html(plots: list[Plot], folder: str) -> str:
    return "".join(f"<figure><img src='{esc(folder)}/{esc(p.filename)}' alt='{esc(p.title)}'>"
                   f"<figcaption><b>{esc(p.title)}</b>: {esc(p.caption)}</figcaption></figure>" for p in plots)


def status_badge(status: str | None) -> str:
    return f"<span class='{esc(status or '')}'>{esc(status or 'unknown')}</span>"
