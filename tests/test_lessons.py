"""The lesson harness: every lessons/NN_name.py runs headless, passes `marimo check`, and proves
its own findings. A lesson that fails, hangs, or checks nothing is red.

How a lesson states its findings: it defines `test_*` functions in its cells (taking no
arguments, asserting on the notebook's variables), like

    @app.cell
    def _(paged_waste, static_waste):
        def test_paged_wastes_less_than_static():
            assert paged_waste < static_waste / 10
        return

A cell of tests holds nothing but `test_*` functions: marimo then runs it with pytest whenever
it runs (its reactive tests), in the editor and in the lesson's single headless run
(docs/hooks/lesson_runner.py, `marimo export ipynb --include-outputs`), the same run the site's
page is made from, so the model is not run twice. Here each check is a pytest item
(`test_lesson_finding[01_kv_cache::test_paged_wastes_less_than_static]`) reading that result.
A lesson's last cell prints its numbers as `print("findings:", findings)` (a dict of plain
values); the run reads that line back as `run.findings["findings"]`, which the site's
Optimization catalog shows. A test elsewhere in tests/ can use the `lesson_run("01_kv_cache")`
fixture and assert on `run.findings` or `run.stdout`.

The second half of this file tests the harness itself on tiny notebooks written to a temporary
folder: that a failing cell, a hang and a failed finding are each reported, and that a page
renders a recorded run.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

import lesson_page
import lesson_runner
from lesson_runner import discover_lessons

REPO = lesson_runner.REPO
LESSONS = discover_lessons()
LESSON_NAME = re.compile(r"^(\d\d)_([a-z0-9_]+)\.py$")
IDS = [p.stem for p in LESSONS]
SLOW_LESSON_S = 90  # LESSONS.md: about a minute headless on a 2-core CPU


def findings_tests_in_source(path: Path) -> list[str]:
    """Names of the lesson's `def test_*` checks, read without running it (pytest collection)."""
    return list(dict.fromkeys(n.name for n in ast.walk(ast.parse(Path(path).read_text("utf-8")))
                              if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")))


def _log_tail(run, n: int = 60) -> str:
    """The last lines marimo's exporter wrote for this run (build/lessons/NN_name/run.log)."""
    return "\n".join((Path(run.out_dir) / "run.log").read_text(errors="replace").splitlines()[-n:])


def _external_lesson_tests(stem: str) -> list[str]:
    """Test files (other than the harness's own) that check this lesson via `lesson_run`."""
    pattern = re.compile(rf"""lesson_run\(\s*["']({re.escape(stem)}|{stem[:2]})["']\s*\)""")
    own = {Path(__file__).name, "test_site.py", "conftest.py"}
    return [
        f.name
        for f in sorted((REPO / "tests").glob("test_*.py"))
        if f.name not in own and pattern.search(f.read_text(encoding="utf-8"))
    ]


FINDINGS = [
    (path, name) for path in LESSONS for name in (findings_tests_in_source(path) or [None])
]
FINDING_IDS = [f"{p.stem}::{n or 'none'}" for p, n in FINDINGS]


# ----------------------------------------------------------------------------- the lessons


def test_lesson_files_are_numbered_marimo_notebooks():
    """lessons/ holds NN_name.py marimo notebooks, numbers unique, names importable words."""
    files = sorted(p for p in (REPO / "lessons").glob("*.py")) if (REPO / "lessons").is_dir() else []
    numbers: dict[str, str] = {}
    for f in files:
        assert LESSON_NAME.match(f.name), (
            f"lessons/{f.name}: lesson files are named NN_name.py (two digits, lowercase words)"
        )
        assert f.name[:2] not in numbers, f"lessons/{f.name} and {numbers[f.name[:2]]} share a number"
        numbers[f.name[:2]] = f.name
        text = f.read_text(encoding="utf-8")
        assert "marimo.App(" in text and 'if __name__ == "__main__":' in text, (
            f"lessons/{f.name} is not a runnable marimo notebook (app = marimo.App(...) and a "
            f"__main__ guard that calls app.run())"
        )
    assert [p.name for p in LESSONS] == [f.name for f in files]
    # The exporter runs a lesson in edit mode with `-- --headless`: a lesson that picks its
    # CPU-sized settings by script mode alone would run its notebook-sized ones in CI.
    for f in files:
        for line in f.read_text(encoding="utf-8").splitlines():
            assert 'mode == "script"' not in line or '"headless" in mo.cli_args()' in line, (
                f"lessons/{f.name}: {line.strip()!r} also needs `or \"headless\" in mo.cli_args()`")


@pytest.mark.parametrize("lesson", LESSONS, ids=IDS)
def test_marimo_check(lesson):
    """`marimo check --strict`: no multiple definitions, cycles, or formatting drift."""
    proc = subprocess.run(
        [sys.executable, "-m", "marimo", "check", "--strict", str(lesson)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert proc.returncode == 0, (
        f"marimo check found problems in {lesson.name} (fix: uv run marimo check --fix "
        f"{lesson.relative_to(REPO)}):\n{proc.stdout}{proc.stderr}"
    )


@pytest.mark.parametrize("lesson", LESSONS, ids=IDS)
def test_lesson_runs_headless(lesson, lesson_run):
    """Every cell runs, as with `python lessons/NN_name.py`, within the time limit, and the
    lesson prints its findings."""
    run = lesson_run(lesson.stem)
    assert not run.timed_out, run.error
    assert run.ok or (run.failed_tests and run.error_cell is None), (
        f"{run.error}\n--- last lines of build/lessons/{lesson.stem}/run.log ---\n{_log_tail(run)}"
    )
    assert run.stdout.strip(), f"{lesson.name} printed nothing: run headless, it must print its findings"
    if run.seconds > SLOW_LESSON_S and not run.reused:
        warnings.warn(f"{lesson.name} took {run.seconds:.0f} s headless (aim: about 60 s)")


@pytest.mark.parametrize("lesson,check", FINDINGS, ids=FINDING_IDS)
def test_lesson_finding(lesson, check, lesson_run):
    """Each of the lesson's own test_* checks passes on its headless run."""
    if check is None:
        external = _external_lesson_tests(lesson.stem)
        if external:
            pytest.skip(f"{lesson.name} is checked by {', '.join(external)}")
        pytest.fail(
            f"{lesson.name} checks nothing: give it at least one test_* function that asserts "
            f"on a finding (see the docstring of tests/test_lessons.py)"
        )
    run = lesson_run(lesson.stem)
    result = next((t for t in run.tests if t["name"] == check), None)
    if result is None:
        pytest.fail(
            f"{check} did not run: the lesson stopped before its checks, or its cell holds more "
            f"than test_* functions (marimo runs pytest only on such cells).\n{run.error}\n"
            f"{_log_tail(run, 30)}"
        )
    assert result["ok"], f"{lesson.name}: {check} failed:\n{result['error']}"


# ----------------------------------------------------------------------------- the harness itself

GOOD = '''
import marimo

__generated_with = "0.0.0"
app = marimo.App()


@app.cell
def _():
    import marimo as mo
    import matplotlib.pyplot as plt
    return mo, plt


@app.cell
def _(mo):
    mo.md(r"""
    # 99 · Harness demo

    After this you can **check** a harness.
    """)
    return


@app.cell
def _(mo):
    headless = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    tokens = 3 * 7
    print(f"tokens: {tokens}, headless: {headless}")
    print("findings:", {"tokens": tokens})
    return headless, tokens


@app.cell
def _(plt, tokens):
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.bar(["a", "b"], [tokens, 2])
    fig
    return


@app.cell
def _(mo, plt):
    _fig, _ax = plt.subplots(figsize=(3, 2))
    _ax.plot([1, 2, 3])
    mo.vstack([_fig, mo.md("A figure inside a layout.")])
    return


@app.cell
def _(mo):
    knob = mo.ui.slider(1, 64, value=16, label="block size")
    knob
    return (knob,)


@app.cell
def _(knob, mo):
    mo.md(f"Block size **{knob.value}**.")
    return


@app.cell
def _(headless, tokens):
    def test_tokens():
        assert tokens == 21

    def test_headless():
        assert headless
    return


if __name__ == "__main__":
    app.run()
'''


def _write(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(body).lstrip(), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("harness")
    path = _write(root / "lessons", "99_demo.py", GOOD)
    run = lesson_runner.run_lesson(path, cache_dir=root / "cache", timeout=120)
    return path, root / "cache", run


def _outputs(run, needle):
    """The outputs of the recorded cell whose source contains `needle`."""
    return next(c.get("outputs", []) for c in run.notebook["cells"] if needle in "".join(c["source"]))


def test_harness_records_prose_prints_figures_widgets_and_findings(demo):
    path, _, run = demo
    assert run.ok, f"{run.error}\n{_log_tail(run)}"
    prose = [c for c in run.notebook["cells"] if c["cell_type"] == "markdown"]
    assert "".join(prose[0]["source"]).startswith("# 99 · Harness demo")
    assert "tokens: 21, headless: True" in run.stdout
    assert _outputs(run, "tokens = 3 * 7")[0]["name"] == "stdout"  # printed where it ran
    figures = run.figures()
    assert [f.name for f in figures] == ["cell03-1.png", "cell04-1.png"]
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in figures)
    assert "marimo-slider data-initial-value=&#x27;16&#x27;" in str(_outputs(run, "mo.ui.slider"))
    assert [(t["name"], t["ok"]) for t in run.tests] == [("test_tokens", True), ("test_headless", True)]
    assert run.findings == {"findings": {"tokens": 21}}
    assert findings_tests_in_source(path) == ["test_tokens", "test_headless"]


def test_harness_reuses_a_cached_run_until_the_notebook_changes(demo):
    path, cache, first = demo
    t0 = time.perf_counter()
    again = lesson_runner.run_lesson(path, cache_dir=cache)
    assert again.reused and again.started == first.started
    assert time.perf_counter() - t0 < 2, "a cached run must not execute the notebook"
    changed = path.with_name("98_changed.py")
    changed.write_text(path.read_text().replace("3 * 7", "3 * 8"))
    assert lesson_runner.lesson_key(changed) != lesson_runner.lesson_key(path)


def test_harness_reports_a_failing_cell(tmp_path):
    path = _write(tmp_path, "97_broken.py", GOOD.replace("tokens = 3 * 7", "tokens = 3 / 0"))
    run = lesson_runner.run_lesson(path, cache_dir=tmp_path / "cache", timeout=120)
    assert not run.ok and not run.timed_out
    assert "ZeroDivisionError" in run.error and "cell 2" in run.error and run.error_cell == 2
    assert _outputs(run, "3 / 0")[-1]["ename"] == "ZeroDivisionError"
    assert not _outputs(run, "ax.bar"), "cells after the failure did not run"


def test_harness_reports_a_failed_finding(tmp_path):
    path = _write(tmp_path, "96_wrong.py", GOOD.replace("assert tokens == 21", "assert tokens == 22"))
    run = lesson_runner.run_lesson(path, cache_dir=tmp_path / "cache", timeout=120)
    assert not run.ok and "test_tokens" in run.error
    failed = run.failed_tests
    assert [t["name"] for t in failed] == ["test_tokens"] and "assert tokens == 22" in failed[0]["error"]


def test_harness_never_reuses_a_failed_run(tmp_path):
    """A failed run (a loaded machine may have killed it) runs again; a passing one is reused."""
    path = _write(tmp_path, "94_flaky.py", GOOD.replace("assert tokens == 21", "assert tokens == 22"))
    first = lesson_runner.run_lesson(path, cache_dir=tmp_path / "cache", timeout=120)
    assert not first.ok
    again = lesson_runner.run_lesson(path, cache_dir=tmp_path / "cache", timeout=120)
    assert not again.reused and not again.ok, "a failed run was reused from the cache"
    shown = lesson_runner.run_lesson(path, cache_dir=tmp_path / "cache", execute=False)
    assert shown.reused and not shown.ok, "execute=False shows the failed run (the site warns)"


def test_strict_site_build_fails_while_a_page_shows_a_failed_run(tmp_path):
    """`mkdocs build --strict` (MINIVLLM_DOCS_LESSONS=cached: nothing runs) on a lesson whose
    cached run failed: the build fails and names the lesson."""
    lessons = tmp_path / "lessons"
    path = _write(lessons, "97_broken.py", GOOD.replace("tokens = 3 * 7", "tokens = 3 / 0"))
    assert not lesson_runner.run_lesson(path, cache_dir=tmp_path / "cache", timeout=120).ok
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", MINIVLLM_LESSONS_DIR=str(lessons),
               MINIVLLM_LESSON_CACHE=str(tmp_path / "cache"), MINIVLLM_DOCS_LESSONS="cached")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode != 0, f"a strict build published a failed run:\n{proc.stderr[-2000:]}"
    assert "lesson 97_broken.py: 97_broken.py: cell 2 raised" in proc.stderr, proc.stderr[-2000:]


def test_harness_kills_a_hanging_lesson(tmp_path):
    body = GOOD.replace("tokens = 3 * 7", "import time\n    time.sleep(600)\n    tokens = 21")
    path = _write(tmp_path, "95_hangs.py", body)
    t0 = time.perf_counter()
    run = lesson_runner.run_lesson(path, cache_dir=tmp_path / "cache", timeout=8)
    assert time.perf_counter() - t0 < 30
    assert run.timed_out and not run.ok and "did not finish within 8 s" in run.error


def test_page_renders_a_recorded_run(demo):
    path, _, run = demo
    md = lesson_page.render_page(
        path, run, figure_prefix="figures/99_demo", source_path="lessons/99_demo.py"
    )
    assert md.startswith("# 99 · Harness demo")
    assert "uv run marimo edit lessons/99_demo.py" in md
    assert "```text title=\"printed\"\ntokens: 21, headless: True" in md
    assert '<img class="lesson-figure" alt="Figure" src="figures/99_demo/cell03-1.png"' in md
    assert '<img class="lesson-figure" alt="Figure" src="figures/99_demo/cell04-1.png"' in md
    assert "marimo-" not in md, "no marimo custom element may reach the page"
    assert '!!! example "Interactive' in md and "<b>block size</b> = <code>16</code>" in md
    assert "\n\nBlock size **16**.\n\n" in md, "what a cell displayed as markdown stays markdown"
    assert "`test_tokens` passed" in md and "FAILED" not in md
    assert 'mo.md(r"""' not in md, "prose cells show their text, not their code"
    # Without a run (quick mode) the page still has the prose and the code.
    bare = lesson_page.render_page(path, None, figure_prefix="f", source_path="lessons/99_demo.py")
    assert bare.startswith("# 99 · Harness demo") and "knob = mo.ui.slider" in bare


def test_a_widget_in_a_layout_shows_its_label_and_value_not_its_index():
    import marimo as mo
    stepped = lesson_page.static_html(mo.ui.slider(steps=[4, 8, 16, 32], value=16,
                                                    label="block_size").text)
    assert "<b>block_size</b> = <code>16</code>" in stepped        # the value, not index 2
    choice = lesson_page.static_html(mo.ui.dropdown({"a": 1, "b": 2}, value="b",
                                                     label="mode").text)
    assert "<b>mode</b> = <code>&quot;b&quot;</code>" in choice
