"""The course tables from docs/course.yml, for README.md and the site (one source of truth).

Custom because the same rows go to two places, README.md (between `<!-- course:NAME -->`
markers) and the site's pages (with links and the lessons' recorded findings, by site.py); a
snippet include could copy a file, not fill tables with page-relative links.

    uv run python docs/hooks/course.py          # rewrite README.md's `course:` sections
    uv run python docs/hooks/course.py --check  # exit 1 if README.md is out of date
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
COURSE = yaml.safe_load((REPO / "docs" / "course.yml").read_text(encoding="utf-8"))
LESSONS = {lesson["number"]: lesson for lesson in COURSE["lessons"]}


def lessons_table(link=None) -> str:
    """Every lesson; `link(lesson)` gives its page's URL, or None (README: no links)."""
    rows = ["| # | Lesson | What it shows | Engine code it drives |", "|---|---|---|---|"]
    for n in COURSE["lessons"]:
        written = n["status"] == "written"
        title = f"[{n['title']}]({url})" if link and (url := link(n)) else n["title"]
        mods = ", ".join(f"`{m}`" for m in n["modules"])
        rows.append(f"| {n['number']} | {title}{'' if written else ' *(coming)*'} | "
                    f"{n['summary']} | {mods} |")
    return "\n".join(rows)


def ranking_table(link=None, columns=None) -> str:
    """The optimizations by throughput impact; `columns` ({header: cell(entry)}) adds the
    mechanism and those columns (the Optimization catalog page: what was measured)."""
    heads = ["Mechanism", *columns] if columns else []
    rows = ["| Rank | Technique | What it buys | Lesson |" + "".join(f" {h} |" for h in heads),
            "|---|---|---|---|" + "---|" * len(heads)]
    for rank, r in enumerate(COURSE["ranking"], start=1):
        lesson = LESSONS[r["lesson"]]
        num = (f"[{r['lesson']}]({url})" if link and (url := link(lesson))
               else r["lesson"] + ("" if lesson["status"] == "written" else " (coming)"))
        cells = [r["mechanism"], *(cell(r) for cell in columns.values())] if columns else []
        rows.append(f"| {rank} | {r['technique']} | {r['buys']} | {num} |"
                    + "".join(f" {c} |" for c in cells))
    return "\n".join(rows)


def gpu_column() -> tuple[str, dict]:
    """The GPU column's header (with the device) and the findings recorded on it, by lesson,
    from course.yml's `gpu` section (empty until a GPU run is recorded in benchmarks.md)."""
    gpu = COURSE.get("gpu") or {}
    device = gpu.get("device")
    return (f"On a GPU ({device})" if device else "On a GPU"), (gpu.get("findings") or {})


def modules_table(exists, link=None, lesson_link=None) -> str:
    rows = ["| Module | What it does | In vLLM | Lessons |", "|---|---|---|---|"]
    for path, what, vllm, lessons in COURSE["modules"]:
        name = f"`{path}`" if exists(path) else f"`{path}` *planned*"
        name = f"[{name}]({link(path)})" if link and exists(path) else name
        refs = [n.strip() for n in lessons.split(",") if n.strip()]
        refs = [f"[{n}]({url})" if lesson_link and (url := lesson_link(LESSONS[n])) else n
                for n in refs]
        rows.append(f"| {name} | {what} | {vllm} | {', '.join(refs)} |")
    return "\n".join(rows)


def readme_sections() -> dict[str, str]:
    return {"lessons": lessons_table(), "ranking": ranking_table(),
            "modules": modules_table(lambda p: (REPO / p).is_file())}


def update_readme(text: str) -> str:
    for name, table in readme_sections().items():
        text = re.sub(rf"(<!-- course:{name} -->\n).*?(<!-- /course:{name} -->)",
                      lambda m: m.group(1) + table + "\n" + m.group(2), text, flags=re.S)
    return text


if __name__ == "__main__":
    readme = REPO / "README.md"
    text = readme.read_text(encoding="utf-8")
    if "--check" in sys.argv:
        sys.exit(0 if update_readme(text) == text else "README.md is out of date: run "
                 "`uv run python docs/hooks/course.py`")
    readme.write_text(update_readme(text), encoding="utf-8")
