"""mkdocs hook: the pages made from code, so the site cannot drift from it.

- A page per lesson: its single headless run (lesson_runner.py, cached in build/lessons/ and
  shared with pytest) rendered by lesson_page.py, then a table of the findings it recorded.
- A page per engine module (course.yml's `modules`), rendered by mkdocstrings.
- The course tables (course.py) with page-relative links; the Optimization catalog's with what
  the lessons measured and a GPU column.

Maintained tools do the rest (mkdocstrings, pymdownx.snippets, mkdocs' `watch`, Material's
offline plugin). Custom here: those generated files and nav entries, the measured columns, and
one CDN polyfill swapped for its vendored copy. MINIVLLM_DOCS_LESSONS: `run` (default: reuse a
cached run or run the notebook), `cached` (the last run, even out of date), `off` (no outputs).
"""

from __future__ import annotations

import logging
import os
import posixpath
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

import course
import lesson_page
import lesson_runner

log = logging.getLogger("mkdocs.hooks.site")
REPO = lesson_runner.REPO
MODE = os.environ.get("MINIVLLM_DOCS_LESSONS", "run").lower()
LESSONS = {p.name[:2]: p for p in lesson_runner.discover_lessons()}
RUNS: dict[str, lesson_runner.LessonRun | None] = {}  # "01" -> the run its page shows
LADDER = "19"  # the lesson whose findings hold the ablation ladder (its `ablation` entry)
# Lessons renumbered when the capstone moved to the end: their old addresses still lead there.
MOVED = {"17_capstone": "19_capstone", "18_simulation": "17_simulation",
         "19_scaling_out": "18_scaling_out"}
RUNG_COUNTS = (("steps", "steps"), ("tokens_per_step", "tokens/step"),
               ("prefill_tokens", "prompt tokens computed"), ("largest_step", "largest step"))
# API pages, dotted: the package (its public API), then every module course.yml lists.
MODULES = ["minivllm", *sorted(path.removesuffix(".py").replace("/", ".") for path, *_
                               in course.COURSE["modules"] if (REPO / path).is_file())]


@event_priority(-100)  # after the theme's plugins (the offline plugin adds a CDN polyfill)
def on_config(config, **kwargs):
    api_pages = lambda package: [{m: f"api/{m}.md"} for m in MODULES  # noqa: E731
                                 if m.split(".")[0] == package]
    for section in (s for s in config.nav or [] if isinstance(s, dict)):
        if (entries := section.get("Lessons")) is not None:
            entries += [{f"{n} · {course.LESSONS.get(n, {}).get('title', p.stem)}":
                         f"lessons/{p.stem}.md"} for n, p in sorted(LESSONS.items())]
        if (entries := section.get("API reference")) is not None:
            entries += [*api_pages("minivllm"), {"Kernels": api_pages("kernels")}]
    # Material's offline plugin loads a polyfill from a CDN; serve our vendored copy instead.
    config.extra["polyfills"] = ["assets/vendor/iframe-worker-shim.js" if "iframe-worker" in p
                                 else p for p in config.extra.get("polyfills", [])]
    return config


def on_files(files: Files, config, **kwargs) -> Files:
    for num, path in sorted(LESSONS.items()):
        run = RUNS[num] = None if MODE == "off" else lesson_runner.run_lesson(
            path, execute=MODE == "run")
        page = lesson_page.render_page(path, run, figure_prefix=f"figures/{path.stem}",
                                       source_path=f"lessons/{path.name}")
        files.append(File.generated(config, f"lessons/{path.stem}.md",
                                    content=page + "\n" + _findings_table(num)))
        for figure in run.figures() if run else []:
            files.append(File.generated(config, f"lessons/figures/{path.stem}/{figure.name}",
                                        abs_src_path=str(figure)))
        log.info(run.summary() if run else f"{path.name}: prose and code only")
        if run and run.error:  # a lesson that fails must not publish quietly (--strict)
            log.warning(f"lesson {path.name}: {run.error.splitlines()[0]} "
                        f"(see build/lessons/{path.stem}/run.log)")
    for m in MODULES:
        src = m.replace(".", "/") + ("/__init__" if m == "minivllm" else "")
        files.append(File.generated(config, f"api/{m}.md",
                                    content=f"# `{m}`\n\nSource: `{src}.py`\n\n::: {m}\n"))
    return files


def _show(v) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k} {_show(x)}" for k, x in v.items())
    if isinstance(v, list):
        return " vs ".join(_show(x) for x in v)
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _found(lesson: str) -> dict:
    run = RUNS.get(lesson)
    return run.findings.get("findings", {}) if run and run.ok else {}


def _recorded(found: dict, names: list[str]) -> str | None:
    """The values of `names` in `found`, shown; None unless every one was recorded."""
    return " vs ".join(_show(found[n]) for n in names) if all(n in found for n in names) else None


def _on_gpu(lesson: str, names: list[str], **finding) -> str:
    """A GPU column's cell: a lesson's findings as course.yml's `gpu` section recorded them."""
    return _recorded(course.GPU["findings"].get(lesson, {}), names) or "no GPU run recorded yet"


def _measured(entry) -> str:
    """What the lessons recorded for a ranking entry: what switching its mechanism off cost on
    the ablation ladder (`rung`), else the values its `finding` names."""
    if rung := entry.get("rung"):
        ladder = _found(LADDER).get("ablation", {})
        if rung not in ladder or "full engine" not in ladder:
            return f"{rung}: (lesson {LADDER} did not record the ablation ladder)"
        off = ladder[rung]              # against the row it differs from in one mechanism
        on = ladder[off.get("vs") or "full engine"]
        return f"switched off ({rung}, lesson {LADDER}'s ladder): " + ", ".join(
            f"{what} {_show(on[k])} → **{_show(off[k])}**" for k, what in RUNG_COUNTS
            if k == "steps" or on[k] != off[k]) + (
            "" if off["same_tokens"] else "; **other tokens**")
    if f := entry.get("finding"):
        shown = _recorded(_found(f["lesson"]), f["names"])
        return f"{f['means']}: " + (f"**{shown}**" if shown else
                                    f"(lesson {f['lesson']} did not record it)")
    return ""


def _findings_table(num: str) -> str:
    """What a lesson's run recorded, beside what a GPU run recorded (once there is one)."""
    rows = [[f"`{k}`", text.replace("|", "/") if len(text := _show(v)) <= 160
             else "(printed above)", _on_gpu(num, [k])] for k, v in _found(num).items()]
    return "## Findings of this run\n\n" + course.table(
        ["Finding", "This run (the machine that built this site)", course.GPU_HEADER],
        rows) if rows else ""


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    rel = lambda target: posixpath.relpath(  # noqa: E731
        target, posixpath.dirname(page.file.src_uri) or ".")
    lesson_link = lambda n: (rel(f"lessons/{LESSONS[n['number']].stem}.md")  # noqa: E731
                             if n["number"] in LESSONS else None)
    api_link = lambda p: rel(f"api/{p.removesuffix('.py').replace('/', '.')}.md")  # noqa: E731
    gpu = lambda e: _on_gpu(  # noqa: E731  a `rung` entry: the whole ladder
        **(e.get("finding") or {"lesson": LADDER, "names": ["ablation"]}))
    for marker, table in (
        ("course:lessons", lambda: course.lessons_table(lesson_link)),
        ("course:ranking-measured", lambda: course.ranking_table(lesson_link, {
            "Measured here": _measured, course.GPU_HEADER: gpu})),
        ("course:ranking", lambda: course.ranking_table(lesson_link)),
        ("engine:modules", lambda: course.modules_table(lambda p: (REPO / p).is_file(),
                                                         api_link, lesson_link)),
    ):
        if f"<!-- {marker} -->" in markdown:
            markdown = markdown.replace(f"<!-- {marker} -->", table())
    return markdown


def on_post_build(config, **kwargs):
    """A page at each moved lesson's old address that sends the reader to its new one."""
    for old, new in MOVED.items():
        page = Path(config.site_dir) / "lessons" / f"{old}.html"
        if not page.exists():  # never over a lesson that now has the old name
            page.write_text(
                f'<!doctype html><meta charset="utf-8"><title>Moved</title>'
                f'<link rel="canonical" href="{new}.html">'
                f'<meta http-equiv="refresh" content="0; url={new}.html">'
                f'<p>This lesson moved: <a href="{new}.html">{new}</a>.</p>\n', encoding="utf-8")
