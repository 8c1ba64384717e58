"""The course has one source, docs/course.yml: README.md's tables are generated from it, its
lesson list matches lessons/, and the course machinery uses marimo's public surface only."""

import re

import pytest

import course
import lesson_runner

REPO = lesson_runner.REPO


def test_readme_tables_come_from_course_yml():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert course.update_readme(readme) == readme, (
        "README.md's course tables are out of date: run `uv run python docs/hooks/course.py`")


def test_course_lists_every_lesson_with_its_status():
    written = {p.name[:2]: f"lessons/{p.name}" for p in lesson_runner.discover_lessons()}
    lessons = course.COURSE["lessons"]
    assert [n["number"] for n in lessons] == sorted({n["number"] for n in lessons})
    for n in lessons:
        assert n["status"] in ("written", "planned"), n
        assert (n["status"] == "written") == (n["number"] in written), (
            f"docs/course.yml: lesson {n['number']} is '{n['status']}' but "
            f"{written.get(n['number'], n['file'])} {'exists' if n['number'] in written else 'does not'}")
        if n["number"] in written:
            assert n["file"] == written[n["number"]]
        assert all(m in {row[0] for row in course.COURSE["modules"]} for m in n["modules"]), n
    assert {r["lesson"] for r in course.COURSE["ranking"]} <= set(course.LESSONS)


def test_course_lists_every_engine_module():
    listed = {row[0] for row in course.COURSE["modules"]}
    files = {str(f.relative_to(REPO)) for d in ("minivllm", "kernels")
             for f in (REPO / d).rglob("*.py") if f.name != "__init__.py"}
    assert not files - listed, f"docs/course.yml lacks modules: {sorted(files - listed)}"


# White-box engine tests may reach into the engine's own internals; nothing reaches into
# marimo's, and the harness and site code use public attributes only.
ENGINE_WHITE_BOX = {"test_engine.py"}  # block_manager._take/_release to pin blocks


def test_no_marimo_internals_or_private_attributes():
    files = [*(REPO / "docs").rglob("*.py"), *(REPO / "tests").glob("*.py"),
             *(REPO / "lessons").glob("*.py")]
    offenders = []
    for f in files:
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), start=1):
            code = line.split("#")[0]
            if re.search(r"\bmarimo\._|\bmarimo\s+import\s+_|from\s+marimo\._", code):
                offenders.append(f"{f.relative_to(REPO)}:{i}: {line.strip()}")
            if f.parent.name != "lessons" and f.name not in ENGINE_WHITE_BOX and re.search(
                    r"(?<!\bself)(?<!\bcls)\.(?!_[_\W])_\w", code):
                offenders.append(f"{f.relative_to(REPO)}:{i}: {line.strip()}")
    assert not offenders, "private access:\n" + "\n".join(offenders)


@pytest.mark.parametrize("entry", [r for r in course.COURSE["ranking"] if r.get("finding")],
                         ids=lambda r: r["technique"])
def test_catalog_findings_are_recorded_by_their_lessons(entry, lesson_run):
    """The Optimization catalog page shows lesson findings by name: each name must exist."""
    f = entry["finding"]
    if course.LESSONS[f["lesson"]]["status"] != "written":
        pytest.skip(f"lesson {f['lesson']} is planned")
    found = lesson_run(f["lesson"]).findings.get("findings", {})
    missing = [n for n in f["names"] if n not in found]
    assert not missing, f"lesson {f['lesson']}'s findings dict lacks {missing} (docs/course.yml)"


@pytest.mark.parametrize("entry", [r for r in course.COURSE["ranking"] if r.get("rung")],
                         ids=lambda r: r["technique"])
def test_catalog_rungs_are_on_the_ablation_ladder(entry, lesson_run):
    """A ranking entry's `rung` is a row of the ablation ladder that lesson 19 records."""
    from minivllm.benchmarks.ablation import RUNGS
    assert entry["rung"] in RUNGS, f"docs/course.yml: {entry['rung']!r} is not in {list(RUNGS)}"
    ladder = lesson_run("19").findings.get("findings", {}).get("ablation", {})
    assert entry["rung"] in ladder and "full engine" in ladder, sorted(ladder)


def test_gpu_column_holds_only_recorded_runs():
    """The GPU column is filled from a run recorded in docs/benchmarks.md, or says none is."""
    gpu = course.COURSE["gpu"]
    assert bool(gpu["device"]) == bool(gpu["source"]) == bool(gpu["findings"]), gpu
    if gpu["source"]:
        assert gpu["source"] in (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
        assert set(gpu["findings"]) <= set(course.LESSONS)
    assert course.GPU_HEADER == (f"On a GPU ({gpu['device']})" if gpu["device"] else "On a GPU")
