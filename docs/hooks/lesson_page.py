"""Turn one recorded run of a lesson notebook into the markdown of its page.

The page is the notebook as a reader would see it after running it: the prose (from `mo.md`
cells, as markdown, so headings reach the table of contents), the code of every other cell,
what each cell printed, and what it displayed (figures as PNG files next to the page, tables and
HTML inline). Widgets are shown at their initial value, with a note that they move in
`marimo edit`. Nothing on the page loads from the network.

Input: a `lesson_runner.LessonRun` (or None: then the page is built from the source alone,
prose and code without outputs, for the site's quick mode). Output: `render_page` returns the
markdown and the figure files the page links to.
"""

from __future__ import annotations

import ast
import html
import inspect
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lesson_runner import FIGURE_SCHEME, LessonRun

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass
class RenderedPage:
    markdown: str
    title: str
    figures: dict[str, Path]  # page-relative URL -> file on disk
    problems: list[str]  # what a strict build should complain about


def render_page(
    lesson: Path,
    run: LessonRun | None,
    *,
    figure_prefix: str,
    source_path: str,
    note: str | None = None,
) -> RenderedPage:
    """Markdown for the page of `lesson`.

    figure_prefix: page-relative folder the figures are served from ("figures/01_kv_cache").
    source_path: the notebook's path as a reader types it ("lessons/01_kv_cache.py").
    note: an extra admonition line (e.g. "this run is out of date").
    """
    cells = _cells(lesson, run)
    tests_by_cell = _tests_by_cell(cells, run)
    problems: list[str] = []
    figures: dict[str, Path] = {}
    parts: list[str] = []
    title = _default_title(lesson)
    banner = _banner(source_path, run, note)
    banner_done = False

    # The page opens with the first prose cell (title and promise) and the banner; cells
    # before it (usually `import marimo as mo`) follow, so the title comes first.
    first_prose = next((i for i, c in enumerate(cells) if _prose(c)), None)
    if first_prose is not None:
        order = [first_prose, *range(first_prose), *range(first_prose + 1, len(cells))]
    else:
        order = list(range(len(cells)))
        parts.append(f"# {title}\n\n{banner}")
        banner_done = True

    for i in order:
        cell = cells[i]
        chunk: list[str] = []
        output = cell.get("output")
        if _prose(cell):
            text = output["data"] if output else cell["static_markdown"]
            text = _sanitize(text, figure_prefix, figures, run)
            if not banner_done:
                heading = re.match(r"\s*#\s+(.+)", text)
                if heading:
                    title = heading.group(1).strip()
                else:
                    parts.append(f"# {title}")
                chunk += [text, banner]
                banner_done = True
            else:
                chunk.append(text)
        else:
            code = cell["code"]
            if output and output["mimetype"] == "text/markdown":
                code = _without_trailing_md(code)  # the prose shows right below, rendered
            if code.strip() and not cell.get("hide_code"):
                chunk.append(_fence(code, "python"))
            stdout = ANSI.sub("", cell.get("stdout") or "")
            if stdout.strip():
                chunk.append(_fence(stdout.rstrip("\n"), "text", title="printed"))
            if output:
                chunk.append(_render_output(output, figure_prefix, figures, run))
            if cell.get("error"):
                problems.append(f"cell {cell['index']} raised an exception")
                chunk.append(
                    '!!! failure "This cell raised an exception when the page was built"\n\n'
                    + _indent(_fence(ANSI.sub("", cell["error"]), "text"))
                )
        results = tests_by_cell.get(cell["index"])
        if results:
            chunk.append(_tests_block(results))
        if chunk:
            parts.append("\n\n".join(c for c in chunk if c))

    if run is not None and run.error and not any(c.get("error") for c in cells):
        problems.append(run.error.splitlines()[0] if run.error else "run failed")
        parts.append(
            '!!! failure "The lesson did not run cleanly when this page was built"\n\n'
            + _indent(_fence(ANSI.sub("", run.error), "text"))
        )
    if run is not None:
        problems.extend(f"findings test {t['name']} failed" for t in run.failed_tests)
    md = "\n\n".join(parts).strip() + "\n"
    return RenderedPage(markdown=md, title=title, figures=figures, problems=problems)


# ----------------------------------------------------------------------------- cells


def _cells(lesson: Path, run: LessonRun | None) -> list[dict[str, Any]]:
    if run is not None and run.cells:
        return run.cells
    # No run (quick mode, or the run died before recording): read the cells from the source.
    from marimo._ast.parse import parse_notebook
    from lesson_runner import _is_markdown_cell

    nb = parse_notebook(lesson.read_text(encoding="utf-8"))
    cells = []
    for idx, c in enumerate(nb.cells if nb is not None else []):
        cell = {
            "index": idx,
            "name": c.name,
            "code": c.code,
            "hide_code": bool((c.options or {}).get("hide_code")),
            "is_markdown": _is_markdown_cell(c.code),
            "stdout": "",
            "output": None,
            "error": None,
        }
        if cell["is_markdown"]:
            cell["static_markdown"] = _static_markdown(c.code)
            if cell["static_markdown"] is None:
                cell["is_markdown"] = False
        cells.append(cell)
    return cells


def _static_markdown(code: str) -> str | None:
    """The text of `mo.md("...")` when it is a plain string (not an f-string)."""
    call = ast.parse(code).body[0].value  # type: ignore[attr-defined]
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return inspect.cleandoc(call.args[0].value)
    return None


def _prose(cell: dict[str, Any]) -> bool:
    """A cell whose only job is `mo.md(...)`: the page shows its text, not its code."""
    output = cell.get("output")
    if not cell.get("is_markdown"):
        return False
    if output is not None:
        return output["mimetype"] == "text/markdown"
    return bool(cell.get("static_markdown"))


def _without_trailing_md(code: str) -> str:
    """The cell's code without its final `mo.md(...)` statement (whose text the page renders)."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return code
    if not body or not _is_md_call(body[-1]):
        return code
    lines = code.splitlines()
    return "\n".join(lines[: body[-1].lineno - 1]).rstrip()


def _is_md_call(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute)
        and stmt.value.func.attr == "md"
        and isinstance(stmt.value.func.value, ast.Name)
        and stmt.value.func.value.id == "mo"
    )


def _default_title(lesson: Path) -> str:
    num, _, rest = lesson.stem.partition("_")
    return f"{num} · {rest.replace('_', ' ').capitalize()}"


def _tests_by_cell(cells: list[dict[str, Any]], run: LessonRun | None) -> dict[int, list]:
    if run is None:
        return {}
    found: dict[int, list] = {}
    for test in run.tests:
        for cell in cells:
            if cell["name"] == test["name"] or re.search(
                rf"\bdef\s+{re.escape(test['name'])}\s*\(", cell["code"]
            ):
                found.setdefault(cell["index"], []).append(test)
                break
    return found


# ----------------------------------------------------------------------------- pieces


def _banner(source_path: str, run: LessonRun | None, note: str | None) -> str:
    lines = [
        '!!! tip "Run this lesson yourself"',
        "",
        f"    - Interactive, widgets live: `uv run marimo edit {source_path}`",
        f"    - Headless, prints its findings: `uv run python {source_path}`",
        "",
    ]
    if run is not None:
        when = run.started[:10] if run.started else "build time"
        lines.append(
            f"    This page was generated from a headless run of the notebook ({when}, "
            f"{run.seconds:.0f} s): the prose, code, printed findings and figures below are "
            f"that run's, and widgets are shown at their initial values."
        )
    else:
        lines.append(
            "    This page shows the notebook's prose and code only: the site was built "
            "without running the lessons (MINIVLLM_DOCS_LESSONS=off)."
        )
    if note:
        lines += ["", f"    {note}"]
    return "\n".join(lines)


def _render_output(
    output: dict[str, Any], prefix: str, figures: dict[str, Path], run: LessonRun | None
) -> str:
    mime, data = output["mimetype"], output["data"]
    if mime == "image":
        url = _figure(data, prefix, figures, run)
        m = re.match(r"cell(\d+)-(\d+)", data)
        alt = f"Figure {m.group(2)} of cell {int(m.group(1))}" if m else "Figure"
        width = f' width="{int(output["width"])}"' if output.get("width") else ""
        return f"![{alt}]({url}){{ .lesson-figure{width} }}"
    if mime == "application/x-lesson-widget":
        label = f" **{data['label']}**" if data.get("label") else ""
        value = data.get("value")
        shown = f", shown at its initial value `{value}`" if value not in (None, "") else ""
        return (
            f'!!! example "Interactive: {data["kind"]}"\n\n'
            f"    A {data['kind']}{label}{shown}. It is live in `marimo edit`; on this page "
            f"the outputs below are computed at this value."
        )
    if mime == "text/markdown":
        return _sanitize(data, prefix, figures, run)
    if mime == "text/html":
        body = _sanitize(data, prefix, figures, run)
        # One raw HTML block: no blank lines, so Markdown leaves it alone.
        body = re.sub(r"\n\s*\n", "\n", body)
        return f'<div class="lesson-output">\n{body}\n</div>'
    return _fence(ANSI.sub("", str(data)).rstrip("\n"), "text")


def _figure(name: str, prefix: str, figures: dict[str, Path], run: LessonRun | None) -> str:
    url = f"{prefix}/{name}"
    if run is not None:
        figures[url] = run.figure_path(name)
    return url


def _tests_block(results: list[dict[str, Any]]) -> str:
    ok = all(t["ok"] for t in results)
    kind = "success" if ok else "failure"
    head = "Findings checked when this page was built" if ok else "A findings check failed"
    lines = [f'!!! {kind} "{head}"', ""]
    for t in results:
        mark = "passed" if t["ok"] else "FAILED"
        lines.append(f"    - `{t['name']}` {mark}")
        if not t["ok"] and t.get("error"):
            lines += ["", _indent(_fence(ANSI.sub("", t["error"]), "text"), 8)]
    return "\n".join(lines)


def _fence(text: str, lang: str, title: str | None = None) -> str:
    longest = max((len(m) for m in re.findall(r"`{3,}", text)), default=2)
    ticks = "`" * max(3, longest + 1)
    attrs = f' title="{title}"' if title else ""
    return f"{ticks}{lang}{attrs}\n{text}\n{ticks}"


def _indent(text: str, n: int = 4) -> str:
    pad = " " * n
    return "\n".join(pad + line if line.strip() else "" for line in text.splitlines())


# ----------------------------------------------------------------------------- HTML from marimo

_UI = re.compile(
    r"<marimo-ui-element\b[^>]*>\s*<(marimo-[\w-]+)\b([^>]*)>.*?</\1>\s*</marimo-ui-element>",
    re.S,
)
_CALLOUT = re.compile(r"<marimo-callout-output\b([^>]*)>\s*</marimo-callout-output>", re.S)
_MIME = re.compile(r"<marimo-mime-renderer\b([^>]*)>\s*</marimo-mime-renderer>", re.S)
_TEX = re.compile(r"<marimo-tex\b[^>]*>(.*?)</marimo-tex>", re.S)
_OTHER = re.compile(r"<(marimo-[\w-]+)\b[^>]*>.*?</\1>", re.S)
_ATTR = re.compile(r"""([\w-]+)=(?:'([^']*)'|"([^"]*)")""")
_CALLOUT_KIND = {"neutral": "note", "warn": "warning", "success": "success", "info": "info",
                 "danger": "danger", "alert": "danger"}


def _attrs(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in _ATTR.finditer(text):
        raw = html.unescape(m.group(2) if m.group(2) is not None else m.group(3))
        try:
            out[m.group(1)] = json.loads(raw)
        except ValueError:
            out[m.group(1)] = raw
    return out


def _strip_tags(s: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", s)).strip()


def _sanitize(text: str, prefix: str, figures: dict[str, Path], run: LessonRun | None) -> str:
    """Replace marimo's custom elements (which need its front end) with plain HTML."""

    def ui(m: re.Match[str]) -> str:
        kind = m.group(1).removeprefix("marimo-")
        a = _attrs(m.group(2))
        label = _strip_tags(str(a.get("data-label") or ""))
        value = a.get("data-initial-value")
        if isinstance(value, list) and len(value) == 1:  # dropdowns hold a one-item list
            value = value[0]
        bits = [f'<span class="lesson-widget" title="live in marimo edit">{html.escape(kind)}']
        if label:
            bits.append(f" <b>{html.escape(label)}</b>")
        if value not in (None, "", [], {}):
            bits.append(f" = <code>{html.escape(json.dumps(value))}</code>")
        return "".join(bits) + "</span>"

    def callout(m: re.Match[str]) -> str:
        a = _attrs(m.group(1))
        kind = _CALLOUT_KIND.get(str(a.get("data-kind", "neutral")), "note")
        body = str(a.get("data-html", ""))
        return f'<div class="admonition {kind}">{body}</div>'

    def mime(m: re.Match[str]) -> str:
        # A rich output nested in a layout (mo.vstack([fig, ...])): a mimetype and its data.
        a = _attrs(m.group(1))
        kind, data = a.get("data-mime"), a.get("data-data")
        if isinstance(data, str) and kind == "application/vnd.marimo+mimebundle":
            try:
                data = json.loads(data)
            except ValueError:
                pass
        if isinstance(data, dict):  # a bundle: pick what a static page shows best
            meta = data.get("__metadata__") or {}
            for k in ("image/png", "image/svg+xml", "image/jpeg", "text/html", "text/markdown",
                      "text/plain"):
                if k in data:
                    kind, width = k, (meta.get(k) or {}).get("width")
                    data = data[k]
                    break
            else:
                return other(m)
        else:
            width = None
        if str(kind).startswith("image/"):
            size = f' width="{int(width)}"' if width else ""
            return f'<img class="lesson-figure" alt="Figure" src="{data}"{size}>'
        if kind in ("text/html", "text/markdown"):
            return str(data)
        if kind == "text/plain":
            return f"<pre>{html.escape(str(data))}</pre>"
        return other(m)

    def tex(m: re.Match[str]) -> str:
        inner = m.group(1)
        if inner.startswith("||[") and inner.endswith("||]"):
            return f'<div class="arithmatex">\\[{inner[3:-3]}\\]</div>'
        if inner.startswith("||(") and inner.endswith("||)"):
            return f'<span class="arithmatex">\\({inner[3:-3]}\\)</span>'
        return f'<span class="arithmatex">{inner}</span>'

    def other(m: re.Match[str]) -> str:
        return (
            '<span class="lesson-widget">interactive output: open the notebook in '
            "<code>marimo edit</code> to see it</span>"
        )

    previous = None
    while previous != text:  # callouts nest markdown that may hold more elements
        previous = text
        text = _UI.sub(ui, text)
        text = _CALLOUT.sub(callout, text)
        text = _MIME.sub(mime, text)
        text = _TEX.sub(tex, text)
    text = _OTHER.sub(other, text)

    def fig(m: re.Match[str]) -> str:
        return _figure(m.group(1), prefix, figures, run)

    return re.sub(re.escape(FIGURE_SCHEME) + r"([\w.-]+)", fig, text)
