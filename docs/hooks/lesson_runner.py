"""Run a lesson notebook once, headless, in a child process; cache what it showed and proved.

pytest (each `test_*` finding is an item) and the site (one page per lesson) share the run, in
build/lessons/NN_name/ (run.ipynb: the cells with their outputs; run.json: findings results,
plain-valued globals, error), keyed by a hash of the notebook, minivllm/ and kernels/.

marimo's public surface does the work: `marimo export ipynb --sort top-down` lists the cells
(prose as markdown), `app.run()` runs them in script mode, exactly as `python lessons/NN.py`
(the lessons' CPU-sized settings), and returns each cell's output and the defs, whose `test_*`
functions are then called; `mo.as_html` renders what a cell displayed. Not `marimo export ipynb
--include-outputs`: it runs in edit mode (the larger interactive settings) and returns no defs.
Custom, because no tool does it: the child process with a time limit and a content-keyed cache,
and saying which cell printed a line or raised (the outermost frame whose source is a cell's).

    uv run python docs/hooks/lesson_runner.py [lessons/01_kv_cache.py ...] [--force]
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import inspect
import json
import linecache
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LESSONS_DIR = Path(os.environ.get("MINIVLLM_LESSONS_DIR", REPO / "lessons"))
CACHE_DIR = Path(os.environ.get("MINIVLLM_LESSON_CACHE", REPO / "build" / "lessons"))
RUNNER_VERSION = "2"  # bump when what a run records changes
DEFAULT_TIMEOUT_S = float(os.environ.get("MINIVLLM_LESSON_TIMEOUT", "480"))  # catches hangs
LESSON_NAME = re.compile(r"^(\d\d)_([a-z0-9_]+)\.py$")


def discover_lessons(lessons_dir: Path = LESSONS_DIR) -> list[Path]:
    """Every lessons/NN_name.py, in reading order."""
    return sorted(p for p in Path(lessons_dir).glob("[0-9][0-9]_*.py") if p.is_file())


def findings_tests_in_source(path: Path) -> list[str]:
    """Names of the lesson's `def test_*` checks, read without running it (pytest collection)."""
    names = [n.name for n in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8")))
             if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    return list(dict.fromkeys(names))


def lesson_key(path: Path) -> str:
    """Cache key: the notebook, the engine sources, this runner and marimo's version."""
    h = hashlib.sha256(f"{RUNNER_VERSION};{version('marimo')}\n".encode() + Path(path).read_bytes())
    for f in sorted(p for d in ("minivllm", "kernels") for p in (REPO / d).rglob("*.py")):
        h.update(str(f.relative_to(REPO)).encode() + f.read_bytes())
    return h.hexdigest()[:16]


class LessonRun(SimpleNamespace):
    """One headless run: build/lessons/NN_name/run.json as attributes (name, key, ok: every cell
    ran and every findings test passed, seconds, tests: [{name, ok, error, seconds}], findings:
    the notebook's JSON-able globals, error, error_cell: the cell that raised, timed_out,
    started, out_dir; stale: the key no longer matches, reused: from the cache)."""

    failed_tests = property(lambda self: [t for t in self.tests if not t["ok"]])

    @property
    def notebook(self) -> dict[str, Any]:
        """run.ipynb: the cells in file order with their outputs (nbformat 4, as JSON)."""
        path = Path(self.out_dir) / "run.ipynb"
        return json.loads(path.read_text("utf-8")) if path.exists() else {"cells": []}

    @property
    def stdout(self) -> str:
        """Everything the lesson printed, in cell order."""
        return "".join("".join(o.get("text", "")) for c in self.notebook["cells"]
                       for o in c.get("outputs", []) if o.get("name") == "stdout")

    def figures(self) -> list[Path]:
        return sorted(Path(self.out_dir).glob("*.png"))

    def log_tail(self, n: int = 60) -> str:
        log = Path(self.out_dir) / "run.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:]) if log.exists() else ""

    def summary(self) -> str:
        status = "ok" if self.ok else ("TIMED OUT" if self.timed_out else "FAILED")
        return (f"{self.name}: {status} in {self.seconds:.1f}s, {len(self.figures())} figures, "
                f"findings {sum(t['ok'] for t in self.tests)}/{len(self.tests)} passed"
                + (" (cached)" if self.reused else ""))

    @classmethod
    def load(cls, out_dir: Path) -> LessonRun:
        return cls(**{"error": None, "error_cell": None, "timed_out": False, "started": "",
                      "stale": False, "reused": False, **json.loads(
                          (Path(out_dir) / "run.json").read_text("utf-8")),
                      "out_dir": str(out_dir)})


def run_lesson(path: Path | str, *, cache_dir: Path = CACHE_DIR, timeout: float | None = None,
               force: bool = False, allow_stale: bool = False,
               execute: bool = True) -> LessonRun | None:
    """The run of `path`, running the lesson only when no run under its current key is cached.

    allow_stale / execute=False accept a run cached under an older key (execute=False and
    nothing cached: None). A lock file serialises runs of one lesson across processes.
    """
    path, cache_dir = Path(path).resolve(), Path(cache_dir)
    key, out_dir = lesson_key(path), cache_dir / path.stem
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f".{path.stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            cached = LessonRun.load(out_dir)
            if not force and (cached.key == key or allow_stale or not execute):
                cached.reused, cached.stale = True, cached.key != key
                return cached
        if not execute:
            return None
        # The child, killed with everything it spawned after `timeout` seconds.
        timeout, tmp = timeout or DEFAULT_TIMEOUT_S, Path(tempfile.mkdtemp(prefix=f".{path.stem}-", dir=cache_dir))
        started, t0, timed_out = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.perf_counter(), False
        with open(tmp / "run.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, __file__, "--child", str(path), str(tmp)],
                                    cwd=REPO, env=dict(os.environ, MPLBACKEND="Agg", PYTHONUNBUFFERED="1"),
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
        record = tmp / "run.json"
        data = json.loads(record.read_text("utf-8")) if record.exists() and not timed_out else {
            "tests": [], "findings": {}, "ok": False,
            "error": (f"{path.name} did not finish within {timeout:.0f} s (killed). A lesson "
                      "must run headless in about a minute." if timed_out
                      else f"{path.name} crashed (exit code {rc}) before recording its run.")}
        data.update(name=path.stem, key=key, seconds=round(time.perf_counter() - t0, 2),
                    timed_out=timed_out, started=started)
        record.write_text(json.dumps(data, indent=1), encoding="utf-8")
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
        return LessonRun.load(out_dir)


def _child(lesson: Path, out: Path) -> int:
    """Run the notebook in this process (the child) and write run.ipynb and run.json."""
    import importlib.util

    import marimo as mo
    import matplotlib.pyplot as plt
    import nbformat

    subprocess.run([sys.executable, "-m", "marimo", "export", "ipynb", "--sort", "top-down",
                    "-f", str(lesson), "-o", str(out / "run.ipynb")], check=True)
    nb = nbformat.read(out / "run.ipynb", as_version=4)
    by_code = {c.source.strip(): i for i, c in enumerate(nb.cells) if c.cell_type == "code"}
    by_file: dict[str, int | None] = {}

    def cell_of(frame) -> int | None:
        """The outermost frame (up from `frame`) whose source is a cell's code."""
        found = None
        while frame is not None:
            f = frame.f_code.co_filename
            if f not in by_file:
                by_file[f] = by_code.get("".join(linecache.getlines(f)).strip())
            found, frame = by_file[f] if by_file[f] is not None else found, frame.f_back
        return found

    def add(i: int, kind: str, **fields) -> dict:
        nb.cells[i].setdefault("outputs", []).append(nbformat.v4.new_output(kind, **fields))
        return nb.cells[i].outputs[-1]

    class Tee:  # stdout: to run.log as it comes, and to the printing cell's outputs
        def write(self, s: str) -> int:
            sys.__stdout__.write(s)
            if s and (i := cell_of(inspect.currentframe().f_back)) is not None:
                outs = nb.cells[i].get("outputs", [])
                last = outs[-1] if outs and outs[-1].get("name") == "stdout" else None
                (last or add(i, "stream", name="stdout", text=""))["text"] += s
            return len(s)

        def flush(self) -> None:
            sys.__stdout__.flush()

        def isatty(self) -> bool:  # libraries ask before they colour (uvicorn's log setup)
            return False

    record: dict[str, Any] = {"tests": [], "findings": {}, "ok": False}
    fig = plt.figure()
    mo.as_html(fig)  # marimo's figure formatters register on first use; a layout needs them
    plt.close(fig)
    sys.path.insert(0, str(lesson.parent))  # as `python lessons/NN_name.py` has it
    spec = importlib.util.spec_from_file_location("lesson", lesson)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)  # defines `app`; the __main__ guard does not fire
        with contextlib.redirect_stdout(Tee()):
            outputs, defs = module.app.run()
    except Exception as exc:  # noqa: BLE001 - a cell raised: say which, keep what ran
        exc = exc.__cause__ or exc
        tb = exc.__traceback__
        while tb.tb_next is not None:  # the innermost frame; its callers include the cell's
            tb = tb.tb_next
        i = cell_of(tb.tb_frame)
        tb = "".join(traceback.format_exception(exc)).strip()
        record.update(error_cell=i, error=f"{lesson.name}: "
                      + (f"cell {i}" if i is not None else "the notebook") + f" raised:\n{tb}")
        if i is not None:
            add(i, "error", ename=type(exc).__name__, evalue=str(exc), traceback=tb.splitlines())
        outputs, defs = [], {}
    for i, value in enumerate(outputs):
        if value is not None and nb.cells[i].cell_type == "code":
            nb.cells[i].setdefault("outputs", []).append(_display(value, i, out))
    for name in [n for n in findings_tests_in_source(lesson) if callable(defs.get(n))]:
        t0, error = time.perf_counter(), None  # in source order
        try:
            defs[name]()
        except BaseException:  # noqa: BLE001
            error = traceback.format_exc()
        record["tests"].append({"name": name, "ok": error is None, "error": error,
                                "seconds": round(time.perf_counter() - t0, 3)})
    if defs:
        failed = [t["name"] for t in record["tests"] if not t["ok"]]
        plain = {k: _plain(v) for k, v in defs.items()}
        record.update(ok=not failed, findings={k: v for k, v in plain.items() if v is not None},
                      error="findings tests failed: " + ", ".join(failed) if failed else None)
    nbformat.write(nb, out / "run.ipynb")
    (out / "run.json").write_text(json.dumps(record, indent=1, default=str), "utf-8")
    return 0 if record["ok"] else 1


def _display(value: Any, index: int, out: Path) -> dict[str, Any]:
    """A cell's displayed value as a notebook output; figures become PNG files beside it."""
    import base64

    import marimo as mo
    import nbformat

    html = mo.as_html(value).text
    if html.lstrip().startswith("<marimo-ui-element") and hasattr(value, "value"):
        shown = value.value if isinstance(value.value, (int, float, str, bool)) else None
        return nbformat.v4.new_output("display_data", data={"text/plain": repr(shown)},
                                      metadata={"widget": type(value).__name__, "value": shown})
    count = iter(range(1, 10**6))

    def save(m: re.Match[str]) -> str:
        name = f"cell{index:02d}-{next(count)}.{m.group(1)}"
        (out / name).write_bytes(base64.b64decode(m.group(2)))
        return f"lesson-figure:{name}"

    html = re.sub(r"data:image/(png|jpeg);base64,([A-Za-z0-9+/=]+)", save, html)
    return nbformat.v4.new_output("display_data", data={"text/html": html})


def _plain(value: Any) -> Any:
    """Numbers, strings and small lists/dicts of them (numpy/torch scalars as numbers): what
    tests may assert on, as JSON gives it back. Anything else: None."""
    def scalar(v):
        if callable(getattr(v, "item", None)) and getattr(v, "shape", None) == ():
            return v.item()
        raise TypeError
    with contextlib.suppress(TypeError, ValueError, RecursionError):
        text = json.dumps(value, default=scalar)
        return json.loads(text) if len(text) < 100_000 else None
    return None


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        sys.exit(_child(Path(sys.argv[2]), Path(sys.argv[3])))
    runs = [run_lesson(p, force="--force" in sys.argv) for p in
            [Path(a) for a in sys.argv[1:] if a != "--force"] or discover_lessons()]
    for run in runs:
        print(run.summary(), *([run.error] if run.error else []), sep="\n")
    sys.exit(any(not run.ok for run in runs))
