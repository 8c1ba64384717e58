"""mkdocs hook: the pages that come from code, so the site never drifts from it.

- One page per lesson: its single headless run (lesson_runner.py, cached in build/lessons/ and
  shared with pytest) rendered by lesson_page.py. Figures are PNG files next to the page.
- One API page per engine module (mkdocstrings renders it from the docstrings).
- The course tables (home page, lessons index, engine guide) and the Optimization catalog page,
  from docs/course.yml (course.py) and the findings the lessons recorded.

MINIVLLM_DOCS_LESSONS: `run` (default: reuse a cached run or run the notebook), `cached` (never
run; use the last run even if out of date), `off` (prose and code only).
"""

from __future__ import annotations

import logging
import os
import posixpath
import re

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
    config.nav.insert(2, {"Optimization catalog": "catalog.md"})
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
    files.append(File.generated(config, "catalog.md", content=_catalog()))
    return files


def _measured(entry) -> str:
    """What the lesson named in the entry's `finding` recorded, from its run."""
    f = entry.get("finding")
    run = _runs.get(f["lesson"]) if f else None
    values = run.findings if run else {}
    value = values.get(f["name"], values.get("findings", {}).get(f["name"])) if f else None
    if value is None:
        return f"{f['means']}: (lesson {f['lesson']} not run)" if f else ""
    shown = [f"{v:.2f}" if isinstance(v, float) else str(v)
             for v in (value if isinstance(value, list) else [value])]
    return f"{f['means']}: **{' vs '.join(shown)}** (lesson {f['lesson']})"


def _catalog() -> str:
    """The Optimization catalog page; its table is filled in by on_page_markdown."""
    mechanisms = "\n".join(f"{r['technique']}\n:   {r['mechanism']}.\n"
                           for r in course.COURSE["ranking"])
    return ("# Optimization catalog\n\nEvery optimization the course covers, ranked by its "
            "effect on throughput (the series' ranking), with the lesson that takes it apart. "
            "The last column is what the lessons measured when this site was built, on that "
            "machine (CPU runs say nothing about HBM; see each lesson).\n\n"
            "<!-- course:ranking-measured -->\n\n## The mechanisms\n\n" + mechanisms)


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    here, lessons = page.file.src_uri, _lessons()

    def rel(target: str) -> str:
        return posixpath.relpath(target, posixpath.dirname(here) or ".")

    def lesson_link(n) -> str:
        path = lessons.get(n["number"])
        return rel(f"lessons/{path.stem}.md") if path else n["file"]

    def api_link(path: str) -> str:
        return rel(f"api/{path.removesuffix('.py').replace('/', '.')}.md")

    exists = lambda p: (REPO / p).is_file()  # noqa: E731
    for marker, table in (
        ("course:lessons", lambda: course.lessons_table(lesson_link)),
        ("course:ranking-measured", lambda: course.ranking_table(lesson_link, _measured)),
        ("course:ranking", lambda: course.ranking_table(lesson_link)),
        ("engine:modules", lambda: course.modules_table(exists, api_link, lesson_link)),
        ("api:modules", lambda: "\n".join(["| Module |", "|---|"] + [
            f"| [`{m}`]({rel(f'api/{m}.md')}) |" for m in _modules()])),
    ):
        if f"<!-- {marker} -->" in markdown:
            markdown = markdown.replace(f"<!-- {marker} -->", table())
    for m in re.finditer(r'--8<--\s+"([^":]+):([\w-]+)"', markdown):  # snippets' check_paths
        text = (REPO / m.group(1)).read_text(encoding="utf-8")  # checks files, not sections
        if f"[start:{m.group(2)}]" not in text or f"[end:{m.group(2)}]" not in text:
            log.warning(f"{here}: {m.group(1)} has no snippet section '{m.group(2)}'")
    return markdown
