"""The course tables from docs/course.yml, for README.md and the site (one source of truth).

Custom because the same rows go to two places, README.md (between `<!-- course:NAME -->`
markers) and the site's pages (with links and the lessons' recorded findings, by site.py); a
snippet include could copy a file, not fill tables with page-relative links.

    uv run python docs/hooks/course.py  # rewrite README.md's `course:` sections (a test checks)
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
COURSE = yaml.safe_load((REPO / "docs" / "course.yml").read_text(encoding="utf-8"))
LESSONS = {lesson["number"]: lesson for lesson in COURSE["lessons"]}
GPU = COURSE["gpu"]  # findings recorded on a GPU, by lesson: none until benchmarks.md has a run
GPU_HEADER = f"On a GPU ({GPU['device']})" if GPU["device"] else "On a GPU"


def table(heads: list[str], rows: list[list[str]]) -> str:
    """A markdown table, in the layout README.md has always had."""
    return "\n".join([f"| {' | '.join(heads)} |", "|" + "---|" * len(heads),
                      *(f"| {' | '.join(row)} |" for row in rows)])


def _linked(text: str, link, target) -> str:
    """`text` linked to `link(target)`'s URL; plain without a link (README) or a URL."""
    return f"[{text}]({url})" if link and (url := link(target)) else text


def lessons_table(link=None) -> str:
    """Every lesson; `link(lesson)` gives its page's URL, or None (README: no links)."""
    return table(["#", "Lesson", "What it shows", "Engine code it drives"], [
        [n["number"], _linked(n["title"], link, n) + ("" if n["status"] == "written"
                                                      else " *(coming)*"),
         n["summary"], ", ".join(f"`{m}`" for m in n["modules"])] for n in COURSE["lessons"]])


def ranking_table(link=None, columns=None) -> str:
    """The optimizations by throughput impact; `columns` ({header: cell(entry)}) adds the
    mechanism and those columns (the Optimization catalog page: what was measured)."""
    columns = {"Mechanism": lambda r: r["mechanism"], **columns} if columns else {}
    return table(["Rank", "Technique", "What it buys", "Lesson", *columns], [
        [str(rank), r["technique"], r["buys"],
         _linked(r["lesson"], link, lesson := LESSONS[r["lesson"]])
         + ("" if lesson["status"] == "written" else " (coming)"),
         *(cell(r) for cell in columns.values())]
        for rank, r in enumerate(COURSE["ranking"], start=1)])


def modules_table(exists, link=None, lesson_link=None) -> str:
    """Every engine module (`*planned*` where `exists(path)` is false), what it does, its vLLM
    counterpart and the lessons that drive it."""
    return table(["Module", "What it does", "In vLLM", "Lessons"], [
        [_linked(f"`{path}`", link if exists(path) else None, path)
         + ("" if exists(path) else " *planned*"), what, vllm,
         ", ".join(_linked(n.strip(), lesson_link, LESSONS[n.strip()])
                   for n in lessons.split(",") if n.strip())]
        for path, what, vllm, lessons in COURSE["modules"]])


def update_readme(text: str) -> str:
    for name, table in {"lessons": lessons_table(), "ranking": ranking_table(),
                        "modules": modules_table(lambda p: (REPO / p).is_file())}.items():
        text = re.sub(rf"(<!-- course:{name} -->\n).*?(<!-- /course:{name} -->)",
                      lambda m: m.group(1) + table + "\n" + m.group(2), text, flags=re.S)
    return text


if __name__ == "__main__":
    readme = REPO / "README.md"
    readme.write_text(update_readme(readme.read_text(encoding="utf-8")), encoding="utf-8")
