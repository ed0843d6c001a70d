"""The two renderers of a collected dossier: Markdown (terminal, GitHub) and one self-contained HTML
page; every string is escaped here (``ui.markdown_text`` / ``ui.html_text``)."""

from __future__ import annotations

import base64
import re
from typing import Any

from tuneproof.ui import html_text, markdown_text, visible_text

#: the dossier's text mixes its own words with the user's (labels, reasons, recorded errors): a paragraph
#: or a cell longer than this is cut with "... (N more characters)"
TEXT_LIMIT = 10_000


def _md_text(v: Any) -> str:
    """Text for Markdown (:func:`tuneproof.ui.markdown_text`): control characters visible, links,
    HTML, emphasis and line-start syntax neutralised; the backticks of the dossier's commands kept."""
    return markdown_text(v, one_line=False, limit=TEXT_LIMIT, code_spans=True)


def _md_cell(v: Any) -> str:
    """One table cell: as :func:`_md_text`, on one line (a newline reads ``\\n``), ``|`` escaped."""
    return markdown_text(v, one_line=True, limit=TEXT_LIMIT, code_spans=True)


def _md_pre(text: str) -> list[str]:
    """A fenced block longer than any run of backticks inside it, its control characters visible."""
    text = visible_text(text, limit=None)
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return [fence, text, fence, ""]


def _html(v: Any) -> str:
    """Text for an HTML attribute or title: escaped, backticks as they are."""
    return html_text(v, limit=TEXT_LIMIT)


def _html_prose(v: Any) -> str:
    """Text of a paragraph, list item, table cell or caption: escaped, and the dossier's code spans
    (```tuneproof compare RUN```, as the Markdown renders them) as ``<code>``, never literal backticks."""
    return html_text(v, limit=TEXT_LIMIT, code_spans=True)


def _md_blocks(blocks: list[dict]) -> list[str]:
    out: list[str] = []
    for b in blocks:
        t = b["type"]
        if t == "p":
            out += [_md_text(b["text"]), ""]
        elif t == "strong":
            out += [f"**{_md_text(b['text'])}**", ""]
        elif t == "list":
            out += [f"- {_md_text(x)}" for x in b["items"]] + [""]
        elif t == "pre":
            out += _md_pre(b["text"])
        elif t == "table":
            out += ["| " + " | ".join(_md_cell(c) for c in b["cols"]) + " |", "|" + "---|" * len(b["cols"])]
            out += ["| " + " | ".join(_md_cell(v) for v in r) + " |" for r in b["rows"]] + [""]
        elif t == "figure":
            out += [f"_(plot in dossier.html: {_md_cell(b['caption'])})_", ""]
        elif t == "details":  # GitHub Markdown folds it; the summary is escaped like HTML text
            out += (
                [f"<details><summary>{_html(b['summary'])}</summary>", ""]
                + _md_blocks(b["blocks"])
                + ["</details>", ""]
            )
    return out


def to_markdown(d: dict[str, Any]) -> str:
    """GitHub-flavoured Markdown; figures are named (they are in the HTML page). The first section
    (the first screen) ends with links to every other section."""
    out = [f"# {_md_text(d['title'])}", ""]
    for i, s in enumerate(d["sections"]):
        out += [f'<a id="{_html(s["id"])}"></a>', "", f"## {_md_cell(s['title'])}", ""] + _md_blocks(s["blocks"])
        if i == 0 and len(d["sections"]) > 1:
            out += ["details: " + " · ".join(f"[{x['title']}](#{x['id']})" for x in d["sections"][1:]), ""]
    return "\n".join(out).rstrip() + "\n"


def first_screen(markdown: str) -> str:
    """The first screen of a dossier rendered by :func:`to_markdown`: its title and the first section
    (Summary) with the links line, as ``dossier.md`` begins, without the ``<a id>`` anchors (HTML the
    terminal does not read). For ``tuneproof report``'s screen."""
    out: list[str] = []
    anchors = 0
    for line in markdown.splitlines():
        if line.startswith('<a id="') and line.endswith("></a>"):
            anchors += 1
            if anchors > 1:
                break
            continue
        out.append(line)
    return "\n".join(out).strip() + "\n"


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1100px;\
margin:2em auto;padding:0 1em;color:#1d2733;line-height:1.45}
h1{border-bottom:2px solid #2f6fb3;padding-bottom:.2em}h2{margin-top:1.8em;border-bottom:1px solid #d5dbe1}
table{border-collapse:collapse;margin:.6em 0;font-size:.88em;display:block;overflow-x:auto}
th,td{border:1px solid #d5dbe1;padding:.25em .55em;text-align:left;vertical-align:top}th{background:#eef2f6}
pre{background:#f4f6f8;padding:.8em;overflow-x:auto}figure{margin:1em 0}\
figure img{max-width:100%;border:1px solid #e3e7eb}
figcaption{font-size:.85em;color:#56606b}.strong{font-weight:600}\
nav a{margin-right:.8em;font-size:.9em;display:inline-block}
td,th{overflow-wrap:break-word}details{margin:.5em 0}summary{cursor:pointer;color:#2f6fb3}
"""


def _html_blocks(blocks: list[dict]) -> list[str]:
    e, a = _html_prose, _html  # element text; attribute values
    out: list[str] = []
    for b in blocks:
        t = b["type"]
        if t == "p":
            out.append(f"<p>{e(b['text'])}</p>")
        elif t == "strong":
            out.append(f'<p class="strong">{e(b["text"])}</p>')
        elif t == "list":
            out.append("<ul>" + "".join(f"<li>{e(str(x))}</li>" for x in b["items"]) + "</ul>")
        elif t == "pre":
            out.append(f"<pre>{html_text(b['text'], limit=None)}</pre>")
        elif t == "table":
            out.append(
                "<table><thead><tr>"
                + "".join(f"<th>{e(str(c))}</th>" for c in b["cols"])
                + "</tr></thead><tbody>"
                + "".join("<tr>" + "".join(f"<td>{e(str(v))}</td>" for v in r) + "</tr>" for r in b["rows"])
                + "</tbody></table>"
            )
        elif t == "figure":
            data = base64.b64encode(b["png"]).decode("ascii")
            out.append(
                f'<figure><img alt="{a(b["caption"])}" src="data:image/png;base64,{data}">'
                f"<figcaption>{e(b['caption'])}</figcaption></figure>"
            )
        elif t == "details":
            out.append(
                f"<details><summary>{e(str(b['summary']))}</summary>"
                + "".join(_html_blocks(b["blocks"]))
                + "</details>"
            )
    return out


def to_html(d: dict[str, Any]) -> str:
    """One self-contained HTML page (inline CSS, images as base64 data URIs, no script, nothing
    fetched); every text is escaped (:func:`tuneproof.ui.html_text`). The first section is the first
    screen; the links to every section follow it."""
    e = _html
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{e(d["title"])}</title>',
        f"<style>{CSS}</style></head><body>",
        f"<h1>{e(d['title'])}</h1>",
    ]
    nav = (
        "<nav>details: " + "".join(f'<a href="#{e(s["id"])}">{e(s["title"])}</a>' for s in d["sections"][1:]) + "</nav>"
    )
    for i, s in enumerate(d["sections"]):
        out.append(f'<section id="{e(s["id"])}"><h2>{e(s["title"])}</h2>')
        out += _html_blocks(s["blocks"])
        out.append("</section>")
        if i == 0:
            out.append(nav)
    out.append("</body></html>")
    return "\n".join(out) + "\n"
