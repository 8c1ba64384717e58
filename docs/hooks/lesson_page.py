"""The markdown of a lesson's page, from its recorded run (build/lessons/NN_name/run.ipynb).

Prose cells and what cells displayed as markdown stay markdown (headings reach the table of
contents and search); then every cell's code, what it printed, what it displayed (figures as
PNG files next to the page), and the findings checks it defines. Nothing loads from the network.

Why not a maintained renderer: mkdocs-jupyter (nbconvert's HTML) was tried on the notebook; it
brings ~60 packages (ipykernel, jupyter_client, ...), loads MathJax and mermaid from cdnjs
unless vendored, and renders a notebook as one HTML block outside Material's code blocks, dark
mode and search. Custom, because no tool does it: marimo's displayed HTML uses custom elements
(`<marimo-callout-output>`, `<marimo-slider>`, ...) that need marimo's front end, from a CDN;
`static_html` turns the ones lessons display into plain HTML, widgets into their values.
"""

from __future__ import annotations

import ast
import contextlib
import html
import json
import re
import subprocess
from pathlib import Path

from lesson_runner import LessonRun, export

ELEMENT = re.compile(r"<(marimo-[\w-]+)\b([^>]*)>(.*?)</\1>", re.S)  # marimo's custom elements
ATTR = re.compile(r"([\w-]+)='([^']*)'")  # their attributes: JSON, HTML-escaped, in '...'


def render_page(lesson: Path, run: LessonRun | None, *, figure_prefix: str, source_path: str) -> str:
    """Markdown for the page of `lesson`, its figures under `figure_prefix` (run.figures(), the
    site copies them there); with run=None, prose and code only (quick mode)."""
    cells = run.notebook["cells"] if run is not None else []
    if not cells:  # no run, or it died before recording: the cells, from marimo's export
        cells = json.loads(subprocess.run(export(lesson), capture_output=True, text=True,
                                          check=True).stdout)["cells"]
    tests, parts = run.tests if run else [], []
    first = next(i for i, c in enumerate(cells) if c["cell_type"] == "markdown")  # the title
    for i in [first, *range(first), *range(first + 1, len(cells))]:
        cell, src = cells[i], "".join(cells[i]["source"])
        outputs = [_output(o, figure_prefix) for o in cell.get("outputs", [])]
        if cell["cell_type"] == "markdown":
            outputs.insert(0, src)
        elif code := _code_to_show(src, any("data" in o for o in cell.get("outputs", []))):
            outputs.insert(0, _fence(code, "python"))
        if checks := [t for t in tests if re.search(rf"^def {t['name']}\(", src, re.M)]:
            ok = all(t["ok"] for t in checks)
            outputs.append(_admonition(
                "success" if ok else "failure",
                "Findings checked when this page was built" if ok else "A findings check failed",
                "\n".join(f"- `{t['name']}` " + ("passed" if t["ok"] else "FAILED\n\n"
                                                  + _indent(_fence(t["error"]))) for t in checks)))
        parts += [*outputs, _banner(source_path, run)] if i == first else outputs
    if run is not None and run.error and run.error_cell is None and not run.failed_tests:
        parts.append(_admonition("failure", "The lesson did not run cleanly when this page was "
                                 "built", _fence(run.error)))
    return "\n\n".join(p for p in parts if p).strip() + "\n"


def _output(o: dict, figure_prefix: str) -> str:
    """One recorded output: printed text, a traceback, or what the cell displayed."""
    body = o.get("data", {}).get("text/markdown") or o.get("data", {}).get("text/html")
    if o.get("name") == "stdout":
        return _fence(o["text"].rstrip("\n"), "text", 'title="printed"') if o["text"].strip() else ""
    if o["output_type"] == "error":
        return _admonition("failure", "This cell raised an exception when the page was built",
                           _fence("\n".join(o["traceback"])))
    if not body:
        return ""
    widget = body.startswith(("&lt;marimo-", "<marimo-ui")) and "callout" not in body[:30]
    body = static_html(html.unescape(body) if body.startswith("&lt;marimo-") else body)
    body = body.replace("lesson-figure:", figure_prefix + "/")
    if "text/markdown" not in o["data"]:  # one HTML block: a blank line would end it
        body = re.sub(r"\n\s*\n", "\n", f'<div class="lesson-output">\n{body}\n</div>')
    return _admonition("example", "Interactive: live in `marimo edit`; the outputs below are "
                       "computed at this value", body) if widget else body


def _code_to_show(code: str, has_output: bool) -> str:
    """The cell's code, less a final `mo.md(...)` whose text shows rendered right below."""
    with contextlib.suppress(SyntaxError, IndexError):
        last = ast.parse(code).body[-1]
        if has_output and isinstance(last, ast.Expr) and ast.unparse(getattr(last.value, "func", last)) == "mo.md":
            return "\n".join(code.splitlines()[: last.lineno - 1]).rstrip()
    return code


def _banner(source_path: str, run: LessonRun | None) -> str:
    how = (f"This page was generated from a headless run of the notebook ({run.started[:10]}, "
           f"{run.seconds:.0f} s): the prose, code, printed findings and figures below are that "
           "run's; widgets show initial values." if run is not None else
           "This page shows the notebook's prose and code only: the site was built without "
           "running the lessons (MINIVLLM_DOCS_LESSONS=off).")
    stale = ("\n\nThis run is out of date: the notebook or the engine changed since. Build with "
             "MINIVLLM_DOCS_LESSONS=run to refresh it." if run and run.stale else "")
    return _admonition("tip", "Run this lesson yourself", f"""\
- Interactive, widgets live: `uv run marimo edit {source_path}`
- Headless, prints its findings: `uv run python {source_path}`

{how}{stale}""")


def _admonition(kind: str, title: str, body: str) -> str:
    return f'!!! {kind} "{title}"\n\n' + _indent(body)


def _fence(text: str, lang: str = "text", attrs: str = "") -> str:
    ticks = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`{3,}", text)), default=2))
    return f"{ticks}{lang}{' ' + attrs if attrs else ''}\n{text}\n{ticks}"


def _indent(text: str, n: int = 4) -> str:
    return "\n".join(" " * n + line if line.strip() else "" for line in text.splitlines())


def _json(value: str):
    with contextlib.suppress(ValueError):
        return json.loads(value)
    return value


def static_html(text: str) -> str:
    """marimo's custom elements as plain HTML: callouts as admonitions (they nest markdown), a
    layout's figures as images, math as arithmatex writes it, a widget as its label and value."""

    def element(m: re.Match[str]) -> str:
        tag, inner = m.group(1), m.group(3)
        a = {k: _json(html.unescape(v)) for k, v in ATTR.findall(m.group(2))}
        if tag == "marimo-callout-output":  # neutral is Material's note
            kind = str(a.get("data-kind")).replace("warn", "warning")
            return f'<div class="admonition {kind}">{static_html(str(a.get("data-html")))}</div>'
        if tag == "marimo-mime-renderer":  # a figure in a layout: a JSON bundle, in JSON
            data = _json(str(a.get("data-data")))
            data = data if isinstance(data, dict) else {"text/html": str(data)}
            if kind := next((k for k in data if k.startswith("image/")), None):
                width = (data.get("__metadata__", {}).get(kind) or {}).get("width")
                return (f'<img class="lesson-figure" alt="Figure" src="{data[kind]}"'
                        + (f' width="{int(width)}">' if width else ">"))
            return static_html(str(data.get("text/html") or data.get("text/plain", "")))
        if tag == "marimo-tex":  # ||( x ||) -> \( x \)
            return '<span class="arithmatex">' + re.sub(r"[|][|]([][()])", r"\\\1", inner) + "</span>"
        if tag == "marimo-ui-element":
            return static_html(inner)
        value, steps = a.get("data-initial-value"), a.get("data-steps")
        if isinstance(steps, list) and isinstance(value, int) and 0 <= value < len(steps):
            value = steps[value]                 # a stepped slider holds the index of its step
        if isinstance(value, list) and len(value) == 1:
            value = value[0]                     # a dropdown holds [its selected option]
        label = html.unescape(re.sub(r"<[^>]+>", "", str(a.get("data-label") or ""))).strip()
        shown = f" = <code>{html.escape(json.dumps(value))}</code>" if value is not None else ""
        return (f'<span class="lesson-widget" title="live in marimo edit">{tag[7:]} '
                f"<b>{html.escape(label)}</b>{shown}</span>")

    return ELEMENT.sub(element, text)
