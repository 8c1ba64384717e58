"""mkdocs hook: the pages that come from code, so the site never drifts from it.

- One page per lesson: its single headless run (lesson_runner.py, cached in build/lessons/ and
  shared with pytest) rendered by lesson_page.py, figures as PNG files next to the page.
- One API page per engine module, rendered by mkdocstrings from the docstrings.
- The course tables (home page, lessons index, engine guide, Optimization catalog with the
  findings the lessons recorded), from docs/course.yml through course.py.

Maintained tools do the rest: mkdocstrings, pymdownx.snippets (source excerpts; `check_paths`
fails a strict build on a missing file or section), mkdocs' `watch` (serve rebuilds when a
lesson or the engine changes), Material's offline plugin and the vendored front end (no request
leaves the host). Custom here: the generated files and nav entries, and one polyfill swapped for
its vendored copy.

MINIVLLM_DOCS_LESSONS: `run` (default: reuse a cached run or run the notebook), `cached` (never
run; use the last run even if out of date), `off` (prose and code only).
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
LESSONS = {p.name[:2]: p for p in lesson_runner.discover_lessons()}
RUNS: dict[str, lesson_runner.LessonRun | None] = {}  # "01" -> the run its page shows
# Engine modules, dotted; `minivllm` is the package's public API.
MODULES = ["minivllm", *(".".join(f.relative_to(REPO).with_suffix("").parts) for f in sorted(
    f for d in ("minivllm", "kernels") for f in (REPO / d).rglob("*.py"))
    if f.name != "__init__.py" and f.read_text(encoding="utf-8").strip())]


@event_priority(-100)  # after the theme's plugins (the offline plugin adds a CDN polyfill)
def on_config(config, **kwargs):
    for section in (s for s in config.nav or [] if isinstance(s, dict)):
        if (entries := section.get("Lessons")) is not None:
            entries += [{f"{n} · {course.LESSONS.get(n, {}).get('title', p.stem)}":
                         f"lessons/{p.stem}.md"} for n, p in sorted(LESSONS.items())]
        if (entries := section.get("API reference")) is not None:
            entries += [{m: f"api/{m}.md"} for m in MODULES if not m.startswith("kernels")]
            entries.append({"Kernels": [{m: f"api/{m}.md"} for m in MODULES
                                        if m.startswith("kernels")]})
    # Material's offline plugin loads a polyfill from a CDN; serve our vendored copy instead.
    config.extra["polyfills"] = ["assets/vendor/iframe-worker-shim.js" if "iframe-worker" in p
                                 else p for p in config.extra.get("polyfills", [])]
    return config


def on_files(files: Files, config, **kwargs) -> Files:
    for num, path in sorted(LESSONS.items()):
        run = RUNS[num] = None if MODE == "off" else lesson_runner.run_lesson(
            path, execute=MODE == "run", allow_stale=MODE == "cached")
        note = ("This run is out of date: the notebook or the engine changed since. Build with "
                "MINIVLLM_DOCS_LESSONS=run to refresh it.") if run and run.stale else None
        page = lesson_page.render_page(path, run, figure_prefix=f"figures/{path.stem}",
                                       source_path=f"lessons/{path.name}", note=note)
        log.info(run.summary() if run else f"{path.name}: prose and code only")
        for problem in page.problems:  # a lesson that fails must not publish quietly
            log.warning(f"lesson {path.name}: {problem} (see build/lessons/{path.stem}/run.log)")
        files.append(File.generated(config, f"lessons/{path.stem}.md",
                                    content=page.markdown + "\n" + _findings_table(num)))
        for url, src in page.figures.items():
            files.append(File.generated(config, f"lessons/{url}", abs_src_path=str(src)))
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


LADDER = "17"  # the lesson whose findings hold the ablation ladder (its `ablation` entry)
RUNG_COUNTS = (("steps", "steps"), ("tokens_per_step", "tokens/step"),
               ("prefill_tokens", "prompt tokens computed"), ("largest_step", "largest step"))


def _measured(entry) -> str:
    """What the lessons recorded for a ranking entry: what switching its mechanism off cost on
    the ablation ladder (`rung`), else the values its `finding` names."""
    if rung := entry.get("rung"):
        ladder = _found(LADDER).get("ablation", {})
        if rung not in ladder or "full engine" not in ladder:
            return f"{rung}: (lesson {LADDER} did not record the ablation ladder)"
        on, off = ladder["full engine"], ladder[rung]
        return f"switched off ({rung}, lesson {LADDER}'s ladder): " + ", ".join(
            f"{what} {_show(on[k])} → **{_show(off[k])}**" for k, what in RUNG_COUNTS
            if k == "steps" or on[k] != off[k]) + (
            "" if off["same_tokens"] else "; **other tokens**")
    if not (f := entry.get("finding")):
        return ""
    found = _found(f["lesson"])
    if not all(name in found for name in f["names"]):
        return f"{f['means']}: (lesson {f['lesson']} did not record it)"
    return f"{f['means']}: **{' vs '.join(_show(found[n]) for n in f['names'])}**"


def _gpu(entry) -> str:
    """The GPU column: the entry's finding as recorded on a GPU (course.yml `gpu`), if it was."""
    f = entry.get("finding") or {"lesson": LADDER, "names": ["ablation"]}
    found = course.gpu_column()[1].get(f["lesson"], {})
    if not all(name in found for name in f["names"]):
        return "no GPU run recorded yet"
    return " vs ".join(_show(found[n]) for n in f["names"])


def _findings_table(num: str) -> str:
    """A lesson's recorded findings, with the GPU column (filled once a GPU run is recorded)."""
    if not (found := _found(num)):
        return ""
    header, gpu = course.gpu_column()
    gpu = gpu.get(num, {})
    rows = ["## Findings of this run", "",
            f"| Finding | This run (the machine that built this site) | {header} |",
            "|---|---|---|"]
    for k, v in found.items():
        shown = text if len(text := _show(v)) <= 160 else "(printed above)"
        rows.append(f"| `{k}` | {shown.replace('|', '/')} | "
                    f"{_show(gpu[k]) if k in gpu else 'no GPU run recorded yet'} |")
    return "\n".join(rows)


def _summary(module: str) -> str:
    """First line of the module's docstring."""
    path = REPO / (module.replace(".", "/") + ("/__init__.py" if module == "minivllm" else ".py"))
    doc = (ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "").strip()
    return doc.splitlines()[0].replace("|", "\\|") if doc else ""


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    rel = lambda target: posixpath.relpath(  # noqa: E731
        target, posixpath.dirname(page.file.src_uri) or ".")
    lesson_link = lambda n: (rel(f"lessons/{LESSONS[n['number']].stem}.md")  # noqa: E731
                             if n["number"] in LESSONS else None)
    api_link = lambda p: rel(f"api/{p.removesuffix('.py').replace('/', '.')}.md")  # noqa: E731
    for marker, table in (
        ("course:lessons", lambda: course.lessons_table(lesson_link)),
        ("course:ranking-measured", lambda: course.ranking_table(lesson_link, {
            "Measured here": _measured, course.gpu_column()[0]: _gpu})),
        ("course:ranking", lambda: course.ranking_table(lesson_link)),
        ("engine:modules", lambda: course.modules_table(lambda p: (REPO / p).is_file(),
                                                         api_link, lesson_link)),
        ("api:modules", lambda: "\n".join(["| Module | What it is |", "|---|---|"] + [
            f"| [`{m}`]({rel(f'api/{m}.md')}) | {_summary(m)} |" for m in MODULES])),
    ):
        if f"<!-- {marker} -->" in markdown:
            markdown = markdown.replace(f"<!-- {marker} -->", table())
    return markdown
