"""The markdown of a lesson's page, from its recorded run (build/lessons/NN_name/run.ipynb).

Prose cells are markdown (headings reach the table of contents and search), then every cell's
code, what it printed, what it displayed (figures as PNG files next to the page), and the
findings checks it defines. Nothing on the page loads from the network.

Why not a maintained renderer: mkdocs-jupyter (nbconvert's HTML) was tried on the run's ipynb;
it brings ~60 packages (ipykernel, jupyter_client, ...), loads MathJax and mermaid from cdnjs
unless vendored, and renders a notebook as one HTML block outside Material's code blocks, dark
mode and search. What no tool does, and stays here: marimo's displayed HTML uses custom elements
(`<marimo-callout-output>`, `<marimo-mime-renderer>`, `<marimo-ui-element>`, `<marimo-tex>`)
that need marimo's front end; `static_html` turns them into plain HTML.
"""

from __future__ import annotations

import ast
import html
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lesson_runner import LessonRun

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass
class RenderedPage:
    markdown: str
    title: str
    figures: dict[str, Path]  # page-relative URL -> file on disk
    problems: list[str]  # what a strict build should complain about


def render_page(lesson: Path, run: LessonRun | None, *, figure_prefix: str, source_path: str,
                note: str | None = None) -> RenderedPage:
    """Markdown for the page of `lesson`; with run=None, prose and code only (quick mode)."""
    cells = run.notebook["cells"] if run is not None else []
    if not cells:  # no run, or it died before recording: the cells, from marimo's export
        out = subprocess.run([sys.executable, "-m", "marimo", "export", "ipynb", "--sort",
                              "top-down", str(lesson)], capture_output=True, text=True, check=True)
        cells = json.loads(out.stdout)["cells"]
    figures: dict[str, Path] = {}

    def fix(text: str) -> str:
        def fig(m: re.Match[str]) -> str:
            figures[f"{figure_prefix}/{m.group(1)}"] = Path(run.out_dir) / m.group(1)
            return f"{figure_prefix}/{m.group(1)}"
        return re.sub(r"lesson-figure:([\w.-]+)", fig, static_html(text))

    src = lambda c: "".join(c.get("source", ""))  # noqa: E731
    first = next((i for i, c in enumerate(cells) if c["cell_type"] == "markdown"), None)
    heading = re.match(r"\s*#\s+(.+)", src(cells[first])) if first is not None else None
    num, _, rest = lesson.stem.partition("_")
    title = heading.group(1).strip() if heading else f"{num} · {rest.replace('_', ' ')}"
    parts = [] if heading else [f"# {title}"]
    order = [first, *range(first), *range(first + 1, len(cells))] if first else range(len(cells))
    tests = {t["name"]: t for t in (run.tests if run else [])}
    problems = [f"findings test {t['name']} failed" for t in (run.failed_tests if run else [])]
    for n, i in enumerate(order):
        cell, chunk = cells[i], []
        if cell["cell_type"] == "markdown":
            chunk.append(src(cell))
        else:
            code = _code_to_show(src(cell), has_output=any(
                o["output_type"] == "display_data" for o in cell.get("outputs", [])))
            chunk += [_fence(code, "python")] if code.strip() else []
            for o in cell.get("outputs", []):
                kind, data = o["output_type"], o.get("data", {})
                if kind == "stream":
                    text = ANSI.sub("", "".join(o["text"])).rstrip("\n")
                    chunk += [_fence(text, "text", 'title="printed"')] if text.strip() else []
                elif kind == "error":
                    problems.append(f"cell {i} raised {o['ename']}")
                    chunk.append('!!! failure "This cell raised an exception when the page was '
                                 'built"\n\n' + _indent(_fence(ANSI.sub("", "\n".join(
                                     o["traceback"])), "text")))
                elif "widget" in o.get("metadata", {}):
                    w = o["metadata"]
                    chunk.append(f'!!! example "Interactive: {w["widget"]}"\n\n    A {w["widget"]},'
                                 f" shown at its initial value `{w['value']}`. It is live in "
                                 f"`marimo edit`; the outputs below are computed at this value.")
                elif "text/html" in data:
                    body = re.sub(r"\n\s*\n", "\n", fix("".join(data["text/html"])))
                    chunk.append(f'<div class="lesson-output">\n{body}\n</div>')
            defined = [t for name, t in tests.items() if re.search(rf"\bdef {name}\(", src(cell))]
            chunk += [_tests_block(defined)] if defined else []
        if n == 0:
            chunk.append(_banner(source_path, run, note))
        parts.append("\n\n".join(chunk))
    if run is not None and run.error and run.error_cell is None and not run.failed_tests:
        problems.append(run.error.splitlines()[0])
        parts.append('!!! failure "The lesson did not run cleanly when this page was built"\n\n'
                     + _indent(_fence(ANSI.sub("", run.error), "text")))
    md = "\n\n".join(p for p in parts if p).strip() + "\n"
    return RenderedPage(markdown=md, title=title, figures=figures, problems=problems)


def _code_to_show(code: str, has_output: bool) -> str:
    """The cell's code, less a final `mo.md(...)` whose text shows rendered right below."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return code
    last = body[-1] if body else None
    is_md = (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call)
             and ast.unparse(last.value.func) == "mo.md")
    return "\n".join(code.splitlines()[: last.lineno - 1]).rstrip() if is_md and has_output \
        else code


def _banner(source_path: str, run: LessonRun | None, note: str | None) -> str:
    lines = ['!!! tip "Run this lesson yourself"', "",
             f"    - Interactive, widgets live: `uv run marimo edit {source_path}`",
             f"    - Headless, prints its findings: `uv run python {source_path}`", ""]
    if run is not None:
        lines.append(f"    This page was generated from a headless run of the notebook "
                     f"({run.started[:10]}, {run.seconds:.0f} s): the prose, code, printed "
                     f"findings and figures below are that run's; widgets show initial values.")
    else:
        lines.append("    This page shows the notebook's prose and code only: the site was "
                     "built without running the lessons (MINIVLLM_DOCS_LESSONS=off).")
    return "\n".join(lines + (["", f"    {note}"] if note else []))


def _tests_block(results: list[dict[str, Any]]) -> str:
    ok = all(t["ok"] for t in results)
    lines = [f'!!! {"success" if ok else "failure"} "'
             + ("Findings checked when this page was built" if ok else "A findings check failed")
             + '"', ""]
    for t in results:
        lines.append(f"    - `{t['name']}` {'passed' if t['ok'] else 'FAILED'}")
        if not t["ok"] and t.get("error"):
            lines += ["", _indent(_fence(ANSI.sub("", t["error"]), "text"), 8)]
    return "\n".join(lines)


def _fence(text: str, lang: str, attrs: str = "") -> str:
    ticks = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`{3,}", text)), default=2))
    return f"{ticks}{lang}{' ' + attrs if attrs else ''}\n{text}\n{ticks}"


def _indent(text: str, n: int = 4) -> str:
    return "\n".join(" " * n + line if line.strip() else "" for line in text.splitlines())


# ----------------------------------------------------------------------------- marimo's HTML

_ELEMENT = re.compile(r"<(marimo-[\w-]+)\b([^>]*)>(.*?)</\1>", re.S)
_ATTR = re.compile(r"""([\w-]+)=(?:'([^']*)'|"([^"]*)")""")
_KIND = {"warn": "warning", "success": "success", "info": "info", "danger": "danger"}


def static_html(text: str) -> str:
    """marimo's custom elements as plain HTML (innermost first: callouts nest markdown)."""

    def attrs(raw: str) -> dict[str, Any]:
        out = {}
        for m in _ATTR.finditer(raw):
            value = html.unescape(m.group(2) if m.group(2) is not None else m.group(3))
            try:
                out[m.group(1)] = json.loads(value)
            except ValueError:
                out[m.group(1)] = value
        return out

    def element(m: re.Match[str]) -> str:
        tag, a, inner = m.group(1), attrs(m.group(2)), m.group(3)
        if tag == "marimo-callout-output":
            kind = _KIND.get(str(a.get("data-kind")), "note")
            return f'<div class="admonition {kind}">{static_html(str(a.get("data-html")))}</div>'
        if tag == "marimo-mime-renderer":
            data = a.get("data-data")
            data = json.loads(data) if isinstance(data, str) and data[:1] == "{" else data
            if isinstance(data, dict):
                kind = next((k for k in data if k.startswith("image/")), None)
                if kind:
                    width = (data.get("__metadata__", {}).get(kind) or {}).get("width")
                    size = f' width="{int(width)}"' if width else ""
                    return f'<img class="lesson-figure" alt="Figure" src="{data[kind]}"{size}>'
                data = data.get("text/html") or data.get("text/plain", "")
            return static_html(str(data))
        if tag == "marimo-tex":
            for a, b in (("||[", "\\["), ("||]", "\\]"), ("||(", "\\("), ("||)", "\\)")):
                inner = inner.replace(a, b)
            return f'<span class="arithmatex">{inner}</span>'
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

    previous = None
    while previous != text:
        previous, text = text, _ELEMENT.sub(element, text)
    return text
