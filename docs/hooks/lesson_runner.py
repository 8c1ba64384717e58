"""Run a lesson notebook once, headless, with marimo's exporter; cache what it showed and proved.

`marimo export ipynb --include-outputs lessons/NN.py -- --headless` runs every cell (edit mode;
`--headless` picks the lessons' CPU-sized settings), keeps what each cell printed, raised and
displayed, and runs each cell made only of `test_*` functions with pytest (marimo's reactive
tests). pytest and the site share that one run, cached in build/lessons/NN_name/ under a hash of
the notebook, minivllm/ and kernels/: run.ipynb (figures as PNG files beside it) and run.json;
a run that failed or timed out is run again, never reused.
Custom, because no tool does it: the time limit, the cache, and reading pytest's report back.

    uv run python docs/hooks/lesson_runner.py [lessons/01_kv_cache.py ...] [--force]
"""

from __future__ import annotations

import ast
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
LESSONS_DIR = Path(os.environ.get("MINIVLLM_LESSONS_DIR", REPO / "lessons"))
CACHE_DIR = Path(os.environ.get("MINIVLLM_LESSON_CACHE", REPO / "build" / "lessons"))
RUNNER_VERSION = "3"  # bump when what a run records changes
DEFAULT_TIMEOUT_S = float(os.environ.get("MINIVLLM_LESSON_TIMEOUT", "480"))  # catches hangs
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
DATA_URI = re.compile(r"data:image/(png|jpeg);base64,([A-Za-z0-9+/=]+)")


def discover_lessons() -> list[Path]:
    """Every lessons/NN_name.py, in reading order."""
    return sorted(p for p in LESSONS_DIR.glob("[0-9][0-9]_*.py") if p.is_file())


def lesson_key(path: Path) -> str:
    """Cache key: the notebook, the engine sources, this runner and marimo's version."""
    h = hashlib.sha256(f"{RUNNER_VERSION};{version('marimo')}\n".encode() + Path(path).read_bytes())
    for f in sorted(p for d in ("minivllm", "kernels") for p in (REPO / d).rglob("*.py")):
        h.update(str(f.relative_to(REPO)).encode() + f.read_bytes())
    return h.hexdigest()[:16]


def export(path: Path, out: Path | None = None) -> list[str]:
    """`marimo export ipynb`, cells in file order: to stdout (prose and code only), or run
    headless into `out` with every cell's outputs."""
    return [sys.executable, "-m", "marimo", "export", "ipynb", "--no-sandbox", "--sort",
            "top-down", "-f", str(path),
            *(["--include-outputs", "-o", str(out), "--", "--headless"] if out else [])]


class LessonRun(SimpleNamespace):
    """One headless run: run.json as attributes (name, key, ok: every cell ran and every check
    passed, seconds, tests: [{name, ok, error}], findings: {"findings": the dict the lesson
    printed}, error, error_cell, timed_out, started), out_dir, stale (the key changed since) and
    reused (from the cache)."""

    failed_tests = property(lambda self: [t for t in self.tests if not t["ok"]])
    notebook = property(lambda self: json.loads((Path(self.out_dir) / "run.ipynb").read_text(
        "utf-8")) if (Path(self.out_dir) / "run.ipynb").exists() else {"cells": []})
    stdout = property(lambda self: "".join(  # everything the lesson printed, in cell order
        o["text"] for c in self.notebook["cells"] for o in c.get("outputs", [])
        if o.get("name") == "stdout"))
    figures = lambda self: sorted(Path(self.out_dir).glob("cell*-*.*"))  # noqa: E731  cellNN-K.png

    def summary(self) -> str:
        status = "ok" if self.ok else ("TIMED OUT" if self.timed_out else "FAILED")
        return (f"{self.name}: {status} in {self.seconds:.1f}s, {len(self.figures())} figures, "
                f"findings {sum(t['ok'] for t in self.tests)}/{len(self.tests)} passed"
                + (" (cached)" if self.reused else ""))

    @classmethod
    def load(cls, out_dir: Path) -> LessonRun:
        return cls(stale=False, reused=False, out_dir=str(out_dir),
                   **json.loads((Path(out_dir) / "run.json").read_text("utf-8")))


def run_lesson(path: Path | str, *, cache_dir: Path = CACHE_DIR, timeout: float | None = None,
               force: bool = False, execute: bool = True) -> LessonRun | None:
    """The run of `path`, running the lesson unless a run under its current key that passed is
    cached: a failed or timed-out run is never reused (a loaded machine may have killed it), it
    runs again. execute=False takes the cached run as it is, out of date or failed (None if there
    is none; the site warns on a failed one, so a strict build fails). A lock file serialises
    runs of one lesson across processes."""
    path, cache_dir = Path(path).resolve(), Path(cache_dir)
    key, out_dir, timeout = lesson_key(path), cache_dir / path.stem, timeout or DEFAULT_TIMEOUT_S
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f".{path.stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            cached = LessonRun.load(out_dir)
            if not force and (cached.key == key and cached.ok or not execute):
                cached.reused, cached.stale = True, cached.key != key
                return cached
        if not execute:
            return None
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.stem}-", dir=cache_dir))
        started, t0 = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.perf_counter()
        with open(tmp / "run.log", "wb") as log:  # the exporter and its kernel: one group
            proc = subprocess.Popen(export(path, tmp / "run.ipynb"), cwd=REPO, stdout=log,
                                    stderr=log, start_new_session=True,
                                    env=dict(os.environ, MPLBACKEND="Agg"))
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait()
        data = _record(path, tmp) if (tmp / "run.ipynb").exists() else {
            "tests": [], "findings": {}, "ok": False, "error_cell": None,
            "error": f"{path.name} did not finish within {timeout:.0f} s (killed). A lesson must "
                     "run headless in about a minute." if rc == -signal.SIGKILL else
                     f"{path.name}: marimo export failed (exit code {rc}), see run.log."}
        data.update(name=path.stem, key=key, seconds=round(time.perf_counter() - t0, 2),
                    timed_out=rc == -signal.SIGKILL, started=started)
        (tmp / "run.json").write_text(json.dumps(data, indent=1), encoding="utf-8")
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
        return LessonRun.load(out_dir)


def _record(lesson: Path, out: Path) -> dict:
    """run.json's results from the exported notebook, rewritten with its figures as files and
    without the checks' reports (kept as results) or marimo's "an ancestor raised" notes."""
    nb, tests, error, error_cell = json.loads((out / "run.ipynb").read_text("utf-8")), [], None, None
    text = lambda v: ANSI.sub("", "".join(v))  # noqa: E731
    for i, cell in enumerate(nb["cells"]):
        src, outputs, count = "".join(cell["source"]), [], iter(range(1, 10**6))
        report = "".join(text(o["text"]) for o in cell.get("outputs", []) if o.get("name") == "stdout")
        report = report if "\nTotal: " in report and re.search(r"^def test_", src, re.M) else ""
        for name in re.findall(r"^def (test_\w+)\(", src, re.M) if report else []:
            ok = re.search(rf"^✓ \S+::{name}$", report, re.M) is not None
            failure = re.search(rf"_{{3,}} {name} _{{3,}}\n(.*?)(?=\n_{{3,}} |\n={{3,}})", report, re.S)
            tests.append({"name": name, "ok": ok, "error": None if ok else (
                failure.group(1).strip() if failure else report)})

        def save(m: re.Match[str]) -> str:  # a figure, as cellNN-K.png beside the notebook
            name = f"cell{i:02d}-{next(count)}.{m.group(1)}"
            (out / name).write_bytes(base64.b64decode(m.group(2)))
            return f"lesson-figure:{name}"

        for o in cell.get("outputs", []):
            data = {k: "".join(v) for k, v in o.get("data", {}).items()}
            if "image/png" in data:
                width = o["metadata"].get("image/png", {}).get("width")
                data = {"text/html": '<img class="lesson-figure" alt="Figure" src="data:image/png;'
                                     f'base64,{data["image/png"]}" width="{width}">'}
            if o["output_type"] == "stream" and not (report and o["name"] == "stdout"):
                outputs.append({**o, "text": text(o["text"])})
            elif o["output_type"] == "error" and o["traceback"]:  # not "Ancestor raised"
                error_cell, error = (i, f"{lesson.name}: cell {i} raised:\n" + "\n".join(
                    o["traceback"])) if error is None else (error_cell, error)
                outputs.append(o)
            elif data:
                outputs.append({**o, "data": {k: DATA_URI.sub(save, v) for k, v in data.items()}})
        cell["outputs"] = outputs
    (out / "run.ipynb").write_text(json.dumps(nb, indent=1), "utf-8")
    found = re.findall(r"^findings: (\{.*\})$", "".join(
        o.get("text", "") for c in nb["cells"] for o in c["outputs"]), re.M)[-1:]
    try:  # numpy scalars print as np.float64(x)
        found = json.loads(json.dumps(ast.literal_eval(re.sub(r"np\.\w+\(([^()]*)\)", r"\1", found[0]))))
    except (IndexError, ValueError, SyntaxError):
        found = None
    failed = [t["name"] for t in tests if not t["ok"]]
    return {"tests": tests, "findings": {"findings": found} if isinstance(found, dict) else {},
            "ok": error is None and not failed, "error_cell": error_cell, "error": error or (
                "findings tests failed: " + ", ".join(failed) if failed else None)}


if __name__ == "__main__":
    runs = [run_lesson(p, force="--force" in sys.argv) for p in
            [Path(a) for a in sys.argv[1:] if a != "--force"] or discover_lessons()]
    for run in runs:
        print(run.summary(), *([run.error] if run.error else []), sep="\n")
    sys.exit(any(not run.ok for run in runs))
