"""mkdocs hook: the pages that come from code, so the site never drifts from it.

- One page per lesson: its single headless run (lesson_runner.py, cached in build/lessons/ and
  shared with pytest) rendered by lesson_page.py. Figures are PNG files next to the page.
- One API page per engine module (mkdocstrings renders it from the docstrings).
- The course tables (home page, lessons index, engine guide) and the Optimization catalog page,
  from docs/course.yml (course.py) and the findings the lessons recorded.

Source excerpts in the guide are pymdownx.snippets' (`check_paths` fails a strict build on a
missing file or section); Material's offline plugin and the vendored front end keep the site
off the network.

MINIVLLM_DOCS_LESSONS: `run` (default: reuse a cached run or run the notebook), `cached` (never
run; use the last run even if out of date), `off` (prose and code only).

What is custom in docs/hooks/, and why (no maintained tool does it): running a lesson once for
both pytest and mkdocs, in a child process with a time limit and a content-keyed cache; saying
which cell printed or raised (marimo's `app.run()` does not); turning marimo's custom HTML
elements into static HTML; the course tables from docs/course.yml. Everything else is marimo's
public API and CLI, nbformat, mkdocstrings, pymdownx.snippets and Material's offline plugin.
"""

from __future__ import annotations

import ast
import logging
import os
import posixpath

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

import course
import lesson_page
import lesson_runner

log = logging.getLogger("mkdocs.hooks.site")
REPO = lesson_runner.REPO
MODE = os.environ.get("MINIVLLM_DOCS_LESSONS", "run").lower()
_runs: dict[str, lesson_runner.LessonRun | None] = {}  # "01" -> the run its page shows


def _lessons():
    return {p.name[:2]: p for p in lesson_runner.discover_lessons()}


def _modules() -> list[str]:
    """Engine modules that exist, dotted; `minivllm` is the package's public API."""
    files = sorted(f for d in ("minivllm", "kernels") for f in (REPO / d).rglob("*.py"))
    mods = [".".join(f.relative_to(REPO).with_suffix("").parts) for f in files
            if f.name != "__init__.py" and f.read_text(encoding="utf-8").strip()]
    return ["minivllm", *mods]


@event_priority(-100)  # after the theme's plugins (the offline plugin adds a CDN polyfill)
def on_config(config, **kwargs):
    for section in config.nav or []:
        (name, entries), = section.items() if isinstance(section, dict) else [(None, None)]
        if name == "Lessons":
            entries += [{f"{n} · {course.LESSONS[n]['title'] if n in course.LESSONS else p.stem}":
                         f"lessons/{p.stem}.md"} for n, p in sorted(_lessons().items())]
        if name == "API reference":
            mods = _modules()
            entries += [{m: f"api/{m}.md"} for m in mods if not m.startswith("kernels")]
            entries.append({"Kernels": [{m: f"api/{m}.md"} for m in mods if m.startswith("kernels")]})
    # Material's offline plugin loads a polyfill from a CDN; serve our vendored copy instead.
    config.extra["polyfills"] = ["assets/vendor/iframe-worker-shim.js" if "iframe-worker" in p
                                 else p for p in config.extra.get("polyfills", [])]
    return config


def on_serve(server, config, builder, **kwargs):
    """`mkdocs serve` rebuilds when a lesson, the course file or the engine changes."""
    for folder in (lesson_runner.LESSONS_DIR, REPO / "minivllm", REPO / "kernels"):
        server.watch(str(folder))
    return server


def on_files(files: Files, config, **kwargs) -> Files:
    for num, path in sorted(_lessons().items()):
        run = None if MODE == "off" else lesson_runner.run_lesson(
            path, execute=MODE == "run", allow_stale=MODE == "cached")
        _runs[num] = run
        note = ("This run is out of date: the notebook or the engine changed since. Build with "
                "MINIVLLM_DOCS_LESSONS=run to refresh it.") if run and run.stale else None
        page = lesson_page.render_page(path, run, figure_prefix=f"figures/{path.stem}",
                                       source_path=f"lessons/{path.name}", note=note)
        log.info(run.summary() if run else f"{path.name}: prose and code only")
        for problem in page.problems:  # a lesson that fails must not publish quietly
            log.warning(f"lesson {path.name}: {problem} (see build/lessons/{path.stem}/run.log)")
        files.append(File.generated(config, f"lessons/{path.stem}.md", content=page.markdown))
        for url, src in page.figures.items():
            files.append(File.generated(config, f"lessons/{url}", abs_src_path=str(src)))
    for m in _modules():
        src = m.replace(".", "/") + ("/__init__" if m == "minivllm" else "")
        files.append(File.generated(config, f"api/{m}.md",
                                    content=f"# `{m}`\n\nSource: `{src}.py`\n\n::: {m}\n"))
    return files


def _measured(entry) -> str:
    """The values the ranking entry's `finding` names, from its lesson's recorded `findings`."""
    f = entry.get("finding")
    if not f:
        return ""
    run = _runs.get(f["lesson"])
    found = run.findings.get("findings", {}) if run and run.ok else {}
    if not all(name in found for name in f["names"]):
        return f"{f['means']}: (lesson {f['lesson']} did not record it)"

    def show(v) -> str:
        if isinstance(v, dict):
            return ", ".join(f"{k} {show(x)}" for k, x in v.items())
        if isinstance(v, list):
            return " vs ".join(show(x) for x in v)
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    return f"{f['means']}: **{' vs '.join(show(found[n]) for n in f['names'])}**"


def _summary(module: str) -> str:
    """First line of the module's docstring."""
    path = REPO / (module.replace(".", "/") + ("/__init__.py" if module == "minivllm" else ".py"))
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or " "
    return doc.strip().splitlines()[0].replace("|", "\\|") if doc.strip() else ""


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    here, lessons = page.file.src_uri, _lessons()

    def rel(target: str) -> str:
        return posixpath.relpath(target, posixpath.dirname(here) or ".")

    def lesson_link(n) -> str:
        path = lessons.get(n["number"])
        return rel(f"lessons/{path.stem}.md") if path else None

    def api_link(path: str) -> str:
        return rel(f"api/{path.removesuffix('.py').replace('/', '.')}.md")

    exists = lambda p: (REPO / p).is_file()  # noqa: E731
    for marker, table in (
        ("course:lessons", lambda: course.lessons_table(lesson_link)),
        ("course:ranking-measured", lambda: course.ranking_table(lesson_link, _measured)),
        ("course:ranking", lambda: course.ranking_table(lesson_link)),
        ("engine:modules", lambda: course.modules_table(exists, api_link, lesson_link)),
        ("api:modules", lambda: "\n".join(["| Module | What it is |", "|---|---|"] + [
            f"| [`{m}`]({rel(f'api/{m}.md')}) | {_summary(m)} |" for m in _modules()])),
    ):
        if f"<!-- {marker} -->" in markdown:
            markdown = markdown.replace(f"<!-- {marker} -->", table())
    return markdown
