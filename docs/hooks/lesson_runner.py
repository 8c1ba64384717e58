"""Run a lesson notebook once, headless, and keep everything it showed.

Two callers need the same run of a lesson, and the run is the expensive part (the real model,
up to a minute on a 2-core CPU):

- tests/test_lessons.py runs every lessons/NN_name.py and checks the lesson's own findings;
- docs/hooks/site.py (the mkdocs hook) turns the same run into the lesson's page.

So a run happens in one place, here, and its result is cached in build/lessons/NN_name/ under a
key that hashes the notebook and the engine source it drives (minivllm/, kernels/). Whichever
caller comes first runs the lesson; the other reads the cache.

A run is exactly `python lessons/NN_name.py` (marimo's script mode, so
`mo.app_meta().mode == "script"` and the lesson picks its CPU-sized settings) in a fresh process
with a time limit, except that for every cell it records the code, what the cell printed and
what it displayed (markdown, HTML, figures saved as PNG files). After the last cell it calls
the notebook's own `test_*` functions (its findings checks) and records which passed. What it
leaves out: `mo.output.append` / `replace` (no-ops in script mode, as in `python lesson.py`)
and anything that needs a live marimo kernel; a page shows widgets at their initial value.

Usage (for people; the callers import `run_lesson`):

    uv run python docs/hooks/lesson_runner.py                 # run (or reuse) every lesson
    uv run python docs/hooks/lesson_runner.py lessons/01_kv_cache.py --force
"""

from __future__ import annotations

import ast
import base64
import contextlib
import fcntl
import hashlib
import io
import json
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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LESSONS_DIR = Path(os.environ.get("MINIVLLM_LESSONS_DIR", REPO / "lessons"))
CACHE_DIR = Path(os.environ.get("MINIVLLM_LESSON_CACHE", REPO / "build" / "lessons"))
# Sources whose change can change what a lesson shows; part of the cache key.
ENGINE_DIRS = ("minivllm", "kernels")
# Bump when the format of run.json or the way a run is recorded changes.
RUNNER_VERSION = "1"
# A lesson should finish in ~60 s on a 2-core CPU (LESSONS.md); this limit only catches hangs.
DEFAULT_TIMEOUT_S = float(os.environ.get("MINIVLLM_LESSON_TIMEOUT", "480"))
LESSON_NAME = re.compile(r"^(\d\d)_([a-z0-9_]+)\.py$")
# Placeholder scheme for figures inside recorded markdown/HTML; the page renderer rewrites it.
FIGURE_SCHEME = "lesson-figure:"


# ----------------------------------------------------------------------------- discovery


def discover_lessons(lessons_dir: Path = LESSONS_DIR) -> list[Path]:
    """Every lessons/NN_name.py, in reading order. An absent folder means no lessons yet."""
    if not lessons_dir.is_dir():
        return []
    return sorted(p for p in lessons_dir.glob("[0-9][0-9]_*.py") if p.is_file())


def findings_tests_in_source(path: Path) -> list[str]:
    """Names of the lesson's own checks: `def test_*` functions and cells named `test_*`.

    Read from the source without running it, so pytest can list one item per check at
    collection time.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
            "test_"
        ):
            if node.name not in names:
                names.append(node.name)
    return names


def lesson_key(path: Path, repo: Path = REPO) -> str:
    """Cache key: the notebook, the engine sources, this runner and marimo's version."""
    h = hashlib.sha256()
    h.update(f"runner={RUNNER_VERSION};marimo={_marimo_version()}\n".encode())
    h.update(path.read_bytes())
    for d in ENGINE_DIRS:
        root = repo / d
        if not root.is_dir():
            continue
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(repo)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _marimo_version() -> str:
    try:
        from importlib.metadata import version

        return version("marimo")
    except Exception:  # pragma: no cover - marimo is a dependency of the project
        return "unknown"


# ----------------------------------------------------------------------------- result


@dataclass
class LessonRun:
    """What one headless run of a lesson showed. Loaded from build/lessons/NN_name/run.json."""

    name: str  # "01_kv_cache"
    path: str  # lessons/01_kv_cache.py, relative to the repo
    key: str  # cache key the run was made under
    ok: bool  # every cell ran and every findings test passed
    seconds: float  # wall time of the whole run, model loading included
    cells: list[dict[str, Any]]  # per cell: code, stdout, output, error, seconds
    tests: list[dict[str, Any]]  # per findings test: name, ok, error, seconds
    findings: dict[str, Any]  # the notebook's JSON-able globals (numbers, strings, lists)
    error: str | None = None  # why the run failed (cell traceback, timeout, crash)
    timed_out: bool = False
    started: str = ""  # ISO time of the run
    out_dir: str = ""  # folder holding run.json, run.log and the figures
    stale: bool = False  # loaded from cache although the key no longer matches
    reused: bool = False  # True when this object came from the cache, not a fresh run
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def failed_tests(self) -> list[dict[str, Any]]:
        return [t for t in self.tests if not t["ok"]]

    @property
    def stdout(self) -> str:
        """Everything the lesson printed, in cell order (what `python lesson.py` prints)."""
        return "".join(c.get("stdout", "") for c in self.cells)

    def log_tail(self, n: int = 60) -> str:
        log = Path(self.out_dir) / "run.log"
        if not log.exists():
            return ""
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])

    def figure_path(self, name: str) -> Path:
        return Path(self.out_dir) / name

    def figures(self) -> list[Path]:
        return sorted(Path(self.out_dir).glob("*.png"))

    def summary(self) -> str:
        status = "ok" if self.ok else ("TIMED OUT" if self.timed_out else "FAILED")
        passed = sum(t["ok"] for t in self.tests)
        return (
            f"{self.name}: {status} in {self.seconds:.1f}s, {len(self.cells)} cells, "
            f"{len(self.figures())} figures, findings tests {passed}/{len(self.tests)} passed"
            + (" (cached)" if self.reused else "")
        )

    @classmethod
    def load(cls, out_dir: Path) -> LessonRun:
        data = json.loads((out_dir / "run.json").read_text(encoding="utf-8"))
        data["out_dir"] = str(out_dir)
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


# ----------------------------------------------------------------------------- run + cache


def run_lesson(
    path: Path | str,
    *,
    cache_dir: Path = CACHE_DIR,
    timeout: float | None = None,
    force: bool = False,
    allow_stale: bool = False,
    execute: bool = True,
) -> LessonRun | None:
    """Return the run of `path`, running the lesson only if no fresh cached run exists.

    force: run even if cached. allow_stale / execute=False: accept a cached run made under an
    older key (the site's quick mode); with execute=False and nothing cached, return None.
    Safe to call from several processes at once: a lock file serialises runs of one lesson.
    """
    path = Path(path).resolve()
    name = path.stem
    key = lesson_key(path)
    out_dir = Path(cache_dir) / name
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _locked(cache_dir / f".{name}.lock"):
        cached = _load_if_present(out_dir)
        if cached is not None and not force:
            if cached.key == key:
                cached.reused = True
                return cached
            if allow_stale or not execute:
                cached.reused, cached.stale = True, True
                return cached
        if not execute:
            return None
        return _run_fresh(path, key, out_dir, timeout or DEFAULT_TIMEOUT_S)


def _load_if_present(out_dir: Path) -> LessonRun | None:
    try:
        return LessonRun.load(out_dir)
    except (OSError, ValueError, TypeError):
        return None


@contextlib.contextmanager
def _locked(lock_path: Path):
    with open(lock_path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run_fresh(path: Path, key: str, out_dir: Path, timeout: float) -> LessonRun:
    """Run the lesson in a child process; write the result atomically into out_dir."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.stem}-", dir=out_dir.parent))
    env = dict(os.environ)
    env.update(
        MARIMO_NO_JS="true",  # marimo renders for a page without JavaScript (markdown, PNG)
        MPLBACKEND="Agg",
        PYTHONUNBUFFERED="1",
        PYTHONHASHSEED=env.get("PYTHONHASHSEED", "0"),
    )
    cmd = [sys.executable, str(Path(__file__).resolve()), "--execute", str(path), str(tmp)]
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    t0 = time.perf_counter()
    timed_out = False
    with open(tmp / "run.log", "wb") as log:
        # A new session, so a timeout can kill the lesson and anything it spawned.
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
    seconds = time.perf_counter() - t0

    record_file = tmp / "run.json"
    if record_file.exists() and not timed_out:
        data = json.loads(record_file.read_text(encoding="utf-8"))
    else:
        data = {"cells": [], "tests": [], "findings": {}, "ok": False}
        if timed_out:
            data["error"] = (
                f"{path.name} did not finish within {timeout:.0f} s (killed). A lesson must run "
                f"headless in about a minute; raise MINIVLLM_LESSON_TIMEOUT only to debug."
            )
        else:
            data["error"] = f"{path.name} crashed (exit code {rc}) before recording its run."
    data.update(
        name=path.stem,
        path=_rel(path),
        key=key,
        seconds=round(seconds, 2),
        timed_out=timed_out,
        started=started,
    )
    if rc != 0 and data.get("ok") and not timed_out:
        data["ok"], data["error"] = False, f"exit code {rc}"
    record_file.write_text(json.dumps(data, indent=1), encoding="utf-8")

    # Swap the new run in; an older run (other key) is replaced.
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return LessonRun.load(out_dir)


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


# ----------------------------------------------------------------------------- child process


def _execute(lesson: Path, out: Path) -> int:
    """Child-process entry: run every cell like `python lesson.py`, recording as it goes."""
    import importlib.util

    sys.path.insert(0, str(lesson.parent))  # as when running `python lessons/NN_name.py`
    record: dict[str, Any] = {"cells": [], "tests": [], "findings": {}, "ok": False}

    def save() -> None:
        (out / "run.json").write_text(json.dumps(record, indent=1, default=str), "utf-8")

    try:
        spec = importlib.util.spec_from_file_location("__lesson__", lesson)
        module = importlib.util.module_from_spec(spec)
        assert spec.loader is not None
        spec.loader.exec_module(module)  # defines `app`; the __main__ guard does not fire
        app = module.app
        recorder = _Recorder(app, lesson, out)
        record["cells"] = recorder.cells
        glbls, error = recorder.run()
        if error is not None:
            record["error"] = error
            save()
            return 1
        record["tests"] = _call_findings_tests(glbls, recorder)
        record["findings"] = _jsonable_globals(glbls)
        failed = [t["name"] for t in record["tests"] if not t["ok"]]
        record["ok"] = not failed
        if failed:
            record["error"] = "findings tests failed: " + ", ".join(failed)
        save()
        return 0 if record["ok"] else 1
    except BaseException:  # noqa: BLE001 - everything goes into the record
        record["error"] = traceback.format_exc()
        save()
        return 1


class _Recorder:
    """marimo's script runner (what `app.run()` uses), recording each cell as it runs."""

    def __init__(self, app: Any, lesson: Path, out: Path) -> None:
        from marimo._ast.app import InternalApp

        self.app = app
        self.out = out
        self.internal = InternalApp(app)
        self.cells: list[dict[str, Any]] = []
        self._counters: dict[int, int] = {}  # images saved per cell
        self.by_id: dict[str, dict[str, Any]] = {}
        for idx, data in enumerate(self.internal.cell_manager.cell_data()):
            code = data.code or ""
            cell = {
                "index": idx,
                "id": str(data.cell_id),
                "name": data.name,
                "code": code,
                "hide_code": bool(getattr(data.config, "hide_code", False)),
                "is_markdown": _is_markdown_cell(code),
                "ran": False,
                "stdout": "",
                "output": None,
                "error": None,
                "seconds": 0.0,
            }
            self.cells.append(cell)
            self.by_id[str(data.cell_id)] = cell
        self.lesson = lesson

    def run(self) -> tuple[dict[str, Any], str | None]:
        from marimo._runtime.app.script_runner import AppScriptRunner

        app = self.app
        from marimo._output.formatters.formatters import register_formatters

        # marimo's rich formatters (matplotlib figures -> PNG, ...) hook into imports; the
        # script runner does not always install them, and a page needs them.
        register_formatters()
        app._maybe_initialize()  # raises on cycles / multiple definitions, as app.run() does
        glbls: dict[str, Any] = dict(app._setup._glbls) if app._setup is not None else {}
        recorder = self

        class Runner(AppScriptRunner):
            def _handle_run_result(self, cid, result, outputs):  # type: ignore[override]
                cell = recorder.by_id.get(str(cid))
                if cell is not None:
                    cell["ran"] = True
                    if result.exception is None:
                        cell["output"] = recorder.format_output(result.output, cell["index"])
                    else:
                        cell["error"] = _format_cell_exception(result.exception)
                return super()._handle_run_result(cid, result, outputs)

        runner = Runner(self.internal, filename=str(self.lesson), glbls=glbls)
        runner._evaluator = _TeeEvaluator(runner._evaluator, self.by_id)
        try:
            _outputs, final_globals = runner.run()
        except BaseException as exc:  # noqa: BLE001
            failed = [c for c in self.cells if c["error"]]
            where = f"cell {failed[0]['index']}" if failed else "the notebook"
            if failed and failed[0]["name"] not in ("_", "__"):
                where += f" ({failed[0]['name']})"
            detail = failed[0]["error"] if failed else "".join(traceback.format_exception(exc))
            return {}, f"{self.lesson.name}: {where} raised:\n{detail}"
        return final_globals, None

    def format_output(self, value: Any, index: int) -> dict[str, Any] | None:
        """Turn a cell's displayed value into something a static page can show."""
        if value is None:
            return None
        widget = _describe_widget(value)
        if widget is not None:
            return {"mimetype": "application/x-lesson-widget", "data": widget}
        from marimo._output.formatting import try_format

        fo = try_format(value)
        if fo.traceback:
            return {"mimetype": "text/plain", "data": f"(could not render output)\n{fo.traceback}"}
        mimetype, data = fo.mimetype, fo.data
        width = None  # display width in CSS pixels, when marimo says (retina figures)
        if mimetype == "application/vnd.marimo+mimebundle":
            bundle = json.loads(data) if isinstance(data, str) else dict(data)
            meta = bundle.pop("__metadata__", None) or {}
            for preferred in (
                "image/png",
                "image/svg+xml",
                "image/jpeg",
                "text/markdown",
                "text/html",
                "text/plain",
            ):
                if preferred in bundle:
                    mimetype, data = preferred, bundle[preferred]
                    width = (meta.get(preferred) or {}).get("width")
                    break
            else:
                mimetype, data = "text/plain", json.dumps(bundle)[:2000]
        if mimetype.startswith("image/"):
            name = self._save_image(index, data, mimetype)
            return {"mimetype": "image", "data": name, "width": width}
        if mimetype in ("text/markdown", "text/html"):
            return {"mimetype": mimetype, "data": self._extract_data_urls(index, str(data))}
        if mimetype == "text/plain" and not str(data).strip():
            return None
        return {"mimetype": "text/plain", "data": str(data)}

    def _save_image(self, index: int, data: Any, mimetype: str) -> str:
        n = self._counters[index] = self._counters.get(index, 0) + 1
        ext = {"image/png": "png", "image/svg+xml": "svg", "image/jpeg": "jpg"}[mimetype]
        name = f"cell{index:02d}-{n}.{ext}"
        raw: bytes
        if isinstance(data, str) and data.startswith("data:"):
            header, _, payload = data.partition(",")
            raw = base64.b64decode(payload) if ";base64" in header else payload.encode()
        elif isinstance(data, bytes):
            raw = data
        else:
            raw = str(data).encode()
        (self.out / name).write_bytes(raw)
        return name

    def _extract_data_urls(self, index: int, text: str) -> str:
        def repl(m: re.Match[str]) -> str:
            mime = m.group(1)
            if mime not in ("image/png", "image/svg+xml", "image/jpeg"):
                return m.group(0)
            return FIGURE_SCHEME + self._save_image(index, m.group(0), mime)

        return re.sub(r"data:(image/[a-z+]+);base64,[A-Za-z0-9+/=]+", repl, text)


class _TeeEvaluator:
    """Wraps marimo's evaluator: time each cell and capture what it prints.

    Printed text still reaches the real stdout (run.log), so a slow lesson shows progress.
    """

    def __init__(self, inner: Any, cells: dict[str, dict[str, Any]]) -> None:
        self.inner = inner
        self.cells = cells

    @contextlib.contextmanager
    def _capture(self, cell_obj: Any):
        cell = self.cells.get(str(getattr(cell_obj, "cell_id", "")))
        buf = _Tee(sys.stdout)
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(buf):
            try:
                yield
            finally:
                if cell is not None:
                    cell["stdout"] += buf.getvalue()
                    cell["seconds"] = round(time.perf_counter() - t0, 3)

    def evaluate_sync(self, cell: Any, glbls: dict[str, Any]) -> Any:
        with self._capture(cell):
            return self.inner.evaluate_sync(cell, glbls)

    async def evaluate(self, cell: Any, glbls: dict[str, Any]) -> Any:
        with self._capture(cell):
            return await self.inner.evaluate(cell, glbls)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _Tee(io.StringIO):
    def __init__(self, echo: Any) -> None:
        super().__init__()
        self.echo = echo

    def write(self, s: str) -> int:
        with contextlib.suppress(Exception):
            self.echo.write(s)
        return super().write(s)

    def flush(self) -> None:
        with contextlib.suppress(Exception):
            self.echo.flush()


def _format_cell_exception(exc: BaseException) -> str:
    from marimo._runtime.exceptions import MarimoRuntimeException

    inner = exc.__cause__ if isinstance(exc, MarimoRuntimeException) and exc.__cause__ else exc
    return "".join(traceback.format_exception(inner)).strip()


def _is_markdown_cell(code: str) -> bool:
    """A prose cell: its only statement is `mo.md(...)` (a page shows the prose, not the call)."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return False
    if len(body) != 1 or not isinstance(body[0], ast.Expr):
        return False
    call = body[0].value
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "md"
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "mo"
    )


def _describe_widget(value: Any) -> dict[str, Any] | None:
    """A marimo UI element, as a page without a kernel can show it: kind, label, value."""
    try:
        from marimo._plugins.ui._core.ui_element import UIElement
    except ImportError:  # pragma: no cover
        return None
    if not isinstance(value, UIElement):
        return None
    label = ""
    args = getattr(value, "_args", None)
    if args is not None:
        label = re.sub(r"<[^>]+>", "", str(getattr(args, "label", "") or "")).strip()
    try:
        # `.value` may not be read in the cell that made the element; the stored value may.
        shown = value._value if hasattr(value, "_value") else value.value
        shown = shown if isinstance(shown, (int, float, str, bool)) else repr(shown)[:200]
    except Exception as e:  # noqa: BLE001
        shown = repr(e)
    return {"kind": type(value).__name__, "label": label, "value": shown}


def _call_findings_tests(glbls: dict[str, Any], recorder: _Recorder) -> list[dict[str, Any]]:
    """Run the lesson's own checks: cells named test_* (already ran) and test_* functions."""
    import inspect

    results: list[dict[str, Any]] = []
    for cell in recorder.cells:
        if cell["name"].startswith("test_"):
            results.append(
                {"name": cell["name"], "ok": cell["ran"] and not cell["error"], "error": None,
                 "seconds": cell["seconds"], "kind": "cell"}
            )
    for name, fn in list(glbls.items()):
        if not name.startswith("test_") or not inspect.isfunction(fn):
            continue
        if any(r["name"] == name for r in results):
            continue
        t0 = time.perf_counter()
        entry: dict[str, Any] = {"name": name, "ok": False, "error": None, "kind": "function"}
        if inspect.signature(fn).parameters:
            entry["error"] = (
                f"{name} takes arguments; a lesson's findings tests take none "
                f"(they read the notebook's variables)."
            )
        else:
            try:
                with contextlib.redirect_stdout(_Tee(sys.stdout)):
                    fn()
                entry["ok"] = True
            except BaseException:  # noqa: BLE001
                entry["error"] = traceback.format_exc()
        entry["seconds"] = round(time.perf_counter() - t0, 3)
        results.append(entry)
    return results


def _jsonable_globals(glbls: dict[str, Any]) -> dict[str, Any]:
    """The notebook's plain values (numbers, strings, small lists/dicts), for tests to assert on."""
    out: dict[str, Any] = {}
    for name, value in glbls.items():
        if name.startswith("_") or name in ("app", "mo"):
            continue
        converted = _to_json(value, depth=0)
        if converted is not _SKIP:
            out[name] = converted
    return out


_SKIP = object()


def _to_json(value: Any, depth: int) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value if not isinstance(value, str) or len(value) <= 10_000 else _SKIP
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if depth > 3:
        return _SKIP
    item = getattr(value, "item", None)  # numpy / torch scalars
    shape = getattr(value, "shape", None)
    if callable(item) and shape is not None and tuple(shape) == ():
        with contextlib.suppress(Exception):
            return _to_json(item(), depth + 1)
    if isinstance(value, (list, tuple)) and len(value) <= 1000:
        items = [_to_json(v, depth + 1) for v in value]
        return _SKIP if any(i is _SKIP for i in items) else items
    if isinstance(value, dict) and len(value) <= 1000:
        items = {str(k): _to_json(v, depth + 1) for k, v in value.items()}
        return _SKIP if any(i is _SKIP for i in items.values()) else items
    return _SKIP


# ----------------------------------------------------------------------------- CLI


def main(argv: list[str]) -> int:
    if argv[:1] == ["--execute"]:
        return _execute(Path(argv[1]), Path(argv[2]))
    import argparse

    parser = argparse.ArgumentParser(description="Run lessons once and cache their outputs.")
    parser.add_argument("lessons", nargs="*", type=Path, help="default: every lessons/NN_*.py")
    parser.add_argument("--force", action="store_true", help="run even if a fresh run is cached")
    parser.add_argument("--timeout", type=float, default=None)
    args = parser.parse_args(argv)
    paths = args.lessons or discover_lessons()
    if not paths:
        print("no lessons/NN_*.py yet")
        return 0
    bad = 0
    for p in paths:
        run = run_lesson(p, force=args.force, timeout=args.timeout)
        assert run is not None
        print(run.summary())
        if not run.ok:
            bad += 1
            print(run.error or "", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
