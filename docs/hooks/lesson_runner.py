"""Run a lesson notebook once, headless, in a child process; cache what it showed and proved.

pytest (each `test_*` finding is an item) and the site (one page per lesson) share the run, in
build/lessons/NN_name/, keyed by a hash of the notebook, minivllm/ and kernels/. The child uses
marimo's public surface only:

- `marimo export ipynb --sort top-down` (no run): the cells in file order, prose as markdown;
- `app.run()`: script mode, exactly `python lessons/NN_name.py` (`mo.app_meta().mode ==
  "script"`: the lessons' CPU-sized settings); it returns each cell's output and the defs;
- `mo.as_html(output).text` for what a cell displayed; the `test_*` functions from the defs,
  called after the run.

It writes run.ipynb (cells with outputs, a standard notebook) and run.json (findings results,
plain-valued globals, error). Not `marimo export ipynb --include-outputs`: it runs the notebook
in edit mode (the lessons' larger interactive settings) and returns no defs to call findings on.
Ours: which cell printed a line or raised (the outermost frame whose source, from linecache, is
a cell's code).

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
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LESSONS_DIR = Path(os.environ.get("MINIVLLM_LESSONS_DIR", REPO / "lessons"))
CACHE_DIR = Path(os.environ.get("MINIVLLM_LESSON_CACHE", REPO / "build" / "lessons"))
ENGINE_DIRS = ("minivllm", "kernels")  # sources whose change can change what a lesson shows
RUNNER_VERSION = "2"  # bump when what a run records changes
DEFAULT_TIMEOUT_S = float(os.environ.get("MINIVLLM_LESSON_TIMEOUT", "480"))  # catches hangs
LESSON_NAME = re.compile(r"^(\d\d)_([a-z0-9_]+)\.py$")


def discover_lessons(lessons_dir: Path = LESSONS_DIR) -> list[Path]:
    """Every lessons/NN_name.py, in reading order."""
    return sorted(p for p in Path(lessons_dir).glob("[0-9][0-9]_*.py") if p.is_file())


def findings_tests_in_source(path: Path) -> list[str]:
    """Names of the lesson's `def test_*` checks, read without running it (pytest collection)."""
    names = []
    for node in ast.walk(ast.parse(Path(path).read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            names += [node.name] if node.name not in names else []
    return names


def lesson_key(path: Path) -> str:
    """Cache key: the notebook, the engine sources, this runner and marimo's version."""
    h = hashlib.sha256(f"{RUNNER_VERSION};{version('marimo')}\n".encode())
    h.update(Path(path).read_bytes())
    for f in sorted(p for d in ENGINE_DIRS for p in (REPO / d).rglob("*.py")):
        h.update(str(f.relative_to(REPO)).encode() + f.read_bytes())
    return h.hexdigest()[:16]


@dataclass
class LessonRun:
    """One headless run, loaded from build/lessons/NN_name/run.json (+ run.ipynb beside it)."""

    name: str
    key: str
    ok: bool  # every cell ran and every findings test passed
    seconds: float
    tests: list[dict[str, Any]]  # name, ok, error, seconds
    findings: dict[str, Any]  # the notebook's JSON-able globals
    error: str | None = None
    error_cell: int | None = None  # index of the cell that raised
    timed_out: bool = False
    started: str = ""
    out_dir: str = ""
    stale: bool = False  # loaded from cache although the key no longer matches
    reused: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def failed_tests(self) -> list[dict[str, Any]]:
        return [t for t in self.tests if not t["ok"]]

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
        data = json.loads((Path(out_dir) / "run.json").read_text(encoding="utf-8"))
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known}, out_dir=str(out_dir))


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
        with contextlib.suppress(OSError, ValueError, TypeError):
            cached = LessonRun.load(out_dir)
            if not force and (cached.key == key or allow_stale or not execute):
                cached.reused, cached.stale = True, cached.key != key
                return cached
        return _run_fresh(path, key, out_dir, timeout or DEFAULT_TIMEOUT_S) if execute else None


def _run_fresh(path: Path, key: str, out_dir: Path, timeout: float) -> LessonRun:
    """The child process, killed with everything it spawned after `timeout` seconds."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.stem}-", dir=out_dir.parent))
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    started, t0, timed_out = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.perf_counter(), False
    with open(tmp / "run.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, __file__, "--child", str(path), str(tmp)],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
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
        "error": (f"{path.name} did not finish within {timeout:.0f} s (killed). A lesson must "
                  f"run headless in about a minute." if timed_out
                  else f"{path.name} crashed (exit code {rc}) before recording its run.")}
    data.update(name=path.stem, key=key, seconds=round(time.perf_counter() - t0, 2),
                timed_out=timed_out, started=started)
    record.write_text(json.dumps(data, indent=1), encoding="utf-8")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return LessonRun.load(out_dir)


# ----------------------------------------------------------------------------- the child


def _child(lesson: Path, out: Path) -> int:
    import importlib.util

    import marimo as mo
    import matplotlib.pyplot as plt
    import nbformat

    record: dict[str, Any] = {"tests": [], "findings": {}, "ok": False}
    subprocess.run([sys.executable, "-m", "marimo", "export", "ipynb", "--sort", "top-down",
                    "-f", str(lesson), "-o", str(out / "run.ipynb")], check=True)
    nb = nbformat.read(out / "run.ipynb", as_version=4)
    cells = nb.cells
    by_code = {c.source.strip(): i for i, c in enumerate(cells) if c.cell_type == "code"}
    by_file: dict[str, int | None] = {}

    def cell_of(frames) -> int | None:
        """The outermost frame whose source is a cell's code: the cell that is running."""
        found = None
        for f in frames:
            if f not in by_file:
                by_file[f] = by_code.get("".join(linecache.getlines(f)).strip())
            found = by_file[f] if by_file[f] is not None else found
        return found

    class Tee:  # stdout: to run.log as it comes, and to the printing cell's outputs
        def write(self, s: str) -> int:
            sys.__stdout__.write(s)
            frame, files = inspect.currentframe(), []
            while frame is not None:
                files, frame = [frame.f_code.co_filename, *files], frame.f_back
            i = cell_of(reversed(files))
            if i is not None and s:
                outs = cells[i].setdefault("outputs", [])
                if not outs or outs[-1].get("name") != "stdout":
                    outs.append(nbformat.v4.new_output("stream", name="stdout", text=""))
                outs[-1]["text"] += s
            return len(s)

        def flush(self) -> None:
            sys.__stdout__.flush()

        def isatty(self) -> bool:  # libraries ask before they colour (uvicorn's log setup)
            return False

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
        frames = [f.filename for f in traceback.extract_tb(exc.__traceback__)]
        record["error_cell"] = i = cell_of(reversed(frames))  # the running cell
        tb = "".join(traceback.format_exception(exc)).strip()
        record["error"] = f"{lesson.name}: " + (f"cell {i}" if i is not None else "the notebook") \
            + f" raised:\n{tb}"
        if i is not None:
            cells[i].setdefault("outputs", []).append(nbformat.v4.new_output(
                "error", ename=type(exc).__name__, evalue=str(exc), traceback=tb.splitlines()))
        nbformat.write(nb, out / "run.ipynb")
        (out / "run.json").write_text(json.dumps(record, indent=1), "utf-8")
        return 1
    assert len(outputs) == len(cells), f"{len(outputs)} outputs for {len(cells)} cells"
    for i, (cell, value) in enumerate(zip(cells, outputs)):
        if value is not None and cell.cell_type == "code":
            cell.setdefault("outputs", []).append(_display(value, i, out))
    for name in findings_tests_in_source(lesson):  # in source order
        if inspect.isfunction(fn := defs.get(name)):
            t0, entry = time.perf_counter(), {"name": name, "ok": False, "error": None}
            try:
                with contextlib.redirect_stdout(sys.__stdout__):
                    fn()
                entry["ok"] = True
            except BaseException:  # noqa: BLE001
                entry["error"] = traceback.format_exc()
            record["tests"].append({**entry, "seconds": round(time.perf_counter() - t0, 3)})
    failed = [t["name"] for t in record["tests"] if not t["ok"]]
    plain = {k: _plain(v) for k, v in defs.items()}
    record.update(ok=not failed, findings={k: v for k, v in plain.items() if v is not _SKIP})
    record["error"] = "findings tests failed: " + ", ".join(failed) if failed else None
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
    count = 0

    def save(m: re.Match[str]) -> str:
        nonlocal count
        count += 1
        name = f"cell{index:02d}-{count}.{m.group(1)}"
        (out / name).write_bytes(base64.b64decode(m.group(2)))
        return f"lesson-figure:{name}"

    html = re.sub(r"data:image/(png|jpeg);base64,([A-Za-z0-9+/=]+)", save, html)
    return nbformat.v4.new_output("display_data", data={"text/html": html})


_SKIP = object()


def _plain(value: Any, depth: int = 0) -> Any:
    """Numbers, strings and small lists/dicts of them (numpy/torch scalars as numbers): what
    tests may assert on. Anything else: _SKIP."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value if len(value) < 10_000 else _SKIP
    if callable(getattr(value, "item", None)) and getattr(value, "shape", None) == ():
        return _plain(value.item(), depth)  # a numpy or torch scalar
    if isinstance(value, (list, tuple, dict)) and depth < 3 and len(value) <= 1000:
        items = value.items() if isinstance(value, dict) else enumerate(value)
        out = {k: _plain(v, depth + 1) for k, v in items if isinstance(k, (str, int))}
        if len(out) < len(value) or any(v is _SKIP for v in out.values()):
            return _SKIP
        return out if isinstance(value, dict) else list(out.values())
    return _SKIP


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        return _child(Path(argv[1]), Path(argv[2]))
    force = "--force" in argv
    bad = 0
    for p in [Path(a) for a in argv if a != "--force"] or discover_lessons():
        run = run_lesson(p, force=force)
        print(run.summary())
        bad += not run.ok
        print(run.error or "", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
