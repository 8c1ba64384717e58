"""mkdocs hook: build the pages that come from code, so the site never drifts from it.

- One page per lesson, from a run of the notebook (docs/hooks/lesson_runner.py runs it once and
  caches the result in build/lessons/; pytest's lesson tests use the same cache), rendered by
  docs/hooks/lesson_page.py. Figures are PNG files next to the page: nothing loads from a CDN.
- One API reference page per engine module that exists (mkdocstrings reads the docstrings).
- The course tables on the home page and the lessons index list every planned lesson and link
  the ones that exist.
- Source excerpts in the engine guide (`--8<-- "minivllm/x.py:name"`) are checked before
  pymdownx.snippets includes them: a file not written yet shows a note, a marker missing from
  a file that exists fails a strict build.

MINIVLLM_DOCS_LESSONS chooses how lessons are run: `run` (default: reuse a fresh cached run or
run the notebook), `cached` (never run; use the last run even if out of date), `off` (prose and
code only, no outputs).
"""

from __future__ import annotations

import ast
import logging
import os
import posixpath
import re
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

import lesson_page
import lesson_runner

log = logging.getLogger("mkdocs.hooks.site")
REPO = lesson_runner.REPO

# The course, in reading order (ARCHITECTURE.md). A lesson links once lessons/NN_*.py exists.
COURSE: list[tuple[str, str, str]] = [
    ("01", "The KV cache", "bytes per token, and what static preallocation wastes"),
    ("02", "PagedAttention", "blocks, block tables, refcounts, copy-on-write"),
    ("03", "FlashAttention", "tiled online softmax and the HBM traffic it saves"),
    ("04", "Continuous batching", "scheduling per iteration instead of per batch"),
    ("05", "Prefix caching and the optimization catalog", "reusing KV blocks by hash"),
    ("06", "Serving", "async engine loop, OpenAI-compatible HTTP, streaming"),
    ("07", "Speculative decoding", "draft, verify, and the rejection rule that keeps it exact"),
    ("08", "Prefill/decode disaggregation", "moving KV blocks between processes"),
    ("09", "GQA and MQA", "sharing KV heads to shrink the cache"),
    ("10", "Chunked prefill", "prefill and decode under one token budget"),
    ("11", "Preemption", "recompute or swap when the cache fills"),
    ("12", "Multi-LoRA", "one base model, many adapters"),
    ("13", "Quantization", "int8/int4 weights and fp8/int8 KV"),
    ("14", "CUDA graphs and torch.compile", "launch overhead"),
    ("15", "Tensor parallelism", "splitting layers across devices"),
]

# Optimizations ranked by their effect on throughput, with the lesson that measures each.
RANKING: list[tuple[str, str, str]] = [
    ("PagedAttention", "02", "KV memory allocated in blocks on demand: little waste, more sequences fit"),
    ("Continuous batching", "04", "a finished sequence's slot is refilled at the next step"),
    ("FlashAttention", "03", "attention without writing the T x T score matrix to HBM"),
    ("GQA / MQA", "09", "fewer KV heads: a smaller cache per token (a model choice)"),
    ("Chunked prefill", "10", "long prompts no longer stall decode; compute and bandwidth both busy"),
    ("Automatic prefix caching", "05", "a shared prompt prefix is computed once"),
    ("Quantization (weights and KV)", "13", "fewer bytes per weight and per cached token"),
    ("Speculative decoding", "07", "several tokens per target-model step, same distribution"),
    ("Preemption", "11", "the engine survives a full cache instead of failing"),
    ("Tensor parallelism", "15", "a model too big for one device, and more bandwidth"),
    ("CUDA graphs / torch.compile", "14", "no per-kernel launch overhead in decode"),
    ("Prefill/decode disaggregation", "08", "each phase on hardware suited to it"),
    ("Multi-LoRA", "12", "many fine-tunes served from one base model"),
]

# The engine's modules: file, what it does, its counterpart in vLLM, the lesson that drives it.
MODULE_MAP: list[tuple[str, str, str, str]] = [
    ("minivllm/llm.py", "offline front end: generate, chat", "vllm.LLM", ""),
    ("minivllm/engine.py", "add_request, and step(): schedule, run, update", "LLMEngine", "04"),
    ("minivllm/sequence.py", "one sample's state: tokens, num_computed_tokens, block table",
     "Sequence", "02"),
    ("minivllm/sampling_params.py", "how a request samples; validated up front",
     "SamplingParams", ""),
    ("minivllm/outputs.py", "what comes back", "RequestOutput, CompletionOutput", ""),
    ("minivllm/config.py", "ModelConfig from config.json, EngineConfig knobs",
     "ModelConfig, SchedulerConfig, CacheConfig", ""),
    ("minivllm/scheduler.py", "waiting/running queues, token budget, preemption", "Scheduler",
     "04, 10, 11"),
    ("minivllm/block_manager.py", "paged KV blocks, refcounts, copy-on-write",
     "BlockSpaceManager / KVCacheManager", "02"),
    ("minivllm/kv_cache.py", "bytes per token; the contiguous baseline cache", "CacheEngine",
     "01"),
    ("minivllm/model_runner.py", "flatten a batch, run the model, sample", "ModelRunner",
     "02, 14"),
    ("minivllm/attention.py", "write K/V into slots; paged attention (torch reference)",
     "attention backends", "02, 03"),
    ("minivllm/models/llama.py", "Llama / Qwen2 / Qwen3 over a flat token batch",
     "model_executor/models/llama.py", "09"),
    ("minivllm/loader.py", "GGUF or Hugging Face weights into the model", "model loader", ""),
    ("minivllm/sampler.py", "temperature, top-k, top-p, seeds, logprobs", "Sampler", ""),
    ("minivllm/detokenizer.py", "incremental detokenization, a few tokens per step",
     "IncrementalDetokenizer", ""),
    ("minivllm/bench.py", "throughput and latency measurements", "benchmarks/", ""),
    ("minivllm/gpu_bench.py", "end to end on a GPU vs transformers, random weights",
     "benchmarks/", ""),
    ("minivllm/prefix_cache.py", "automatic prefix caching", "enable_prefix_caching", "05"),
    ("minivllm/async_engine.py", "async engine loop and streaming", "AsyncLLMEngine", "06"),
    ("minivllm/server.py", "OpenAI-compatible HTTP server", "vllm serve", "06"),
    ("minivllm/spec_decode.py", "draft, verify, rejection sampling", "speculative decoding",
     "07"),
    ("minivllm/disagg.py", "prefill/decode split, KV transfer", "KV connector", "08"),
    ("minivllm/lora.py", "many LoRA adapters on one base", "LoRA (Punica)", "12"),
    ("minivllm/quant.py", "weight and KV quantization", "quantization", "13"),
    ("minivllm/parallel.py", "tensor parallelism over torch.distributed",
     "tensor_parallel_size", "15"),
    ("minivllm/triton_attention.py", "the Triton attention backend: write K/V, pick a kernel",
     "attention backend selection", "03"),
    ("kernels/write_kv.py", "scatter K/V into their slots (Triton)", "reshape_and_cache", "02"),
    ("kernels/flash_attention.py", "tiled online-softmax attention over paged KV (Triton)",
     "FlashAttention backend", "03"),
    ("kernels/paged_attention.py", "decode attention split along the context (Triton)",
     "paged_attention_v2 / flash-decoding", "03"),
    ("kernels/paged_batch.py", "random paged batches for kernel tests and benchmarks", "", ""),
    ("kernels/aot.py", "compile every kernel for sm_90 / sm_80 without a GPU", "", ""),
]

LESSON_MODE = os.environ.get("MINIVLLM_DOCS_LESSONS", "run").lower()

_lessons: dict[str, Path] = {}  # "01" -> lessons/01_kv_cache.py
_titles: dict[str, str] = {}  # "01" -> page title, once rendered
_modules: list[str] = []  # engine modules that exist, dotted


# ----------------------------------------------------------------------------- config / nav


def _discover() -> None:
    _lessons.clear()
    for path in lesson_runner.discover_lessons():
        _lessons.setdefault(path.name[:2], path)
    _modules[:] = []
    for package in ("minivllm", "kernels"):
        root = REPO / package
        for f in sorted(root.rglob("*.py")) if root.is_dir() else []:
            if f.name == "__init__.py" and f.parent == root and package == "minivllm":
                _modules.append(package)  # the package's public API
                continue
            if f.name == "__init__.py" or not f.read_text(encoding="utf-8").strip():
                continue
            rel = f.relative_to(REPO).with_suffix("")
            _modules.append(".".join(rel.parts))


def _course_title(num: str) -> str:
    return next((t for n, t, _ in COURSE if n == num), _lessons[num].stem[3:].replace("_", " "))


@event_priority(-100)  # after the theme's plugins (the offline plugin adds a CDN polyfill)
def on_config(config, **kwargs):
    _discover()
    nav = config.nav or []
    for section in nav:
        if not isinstance(section, dict):
            continue
        (name, entries), = section.items()
        if name == "Lessons" and isinstance(entries, list):
            entries += [
                {f"{num} · {_course_title(num)}": f"lessons/{path.stem}.md"}
                for num, path in sorted(_lessons.items())
            ]
        if name == "API reference" and isinstance(entries, list):
            engine = [m for m in _modules if m.startswith("minivllm")]
            kernels = [m for m in _modules if m.startswith("kernels")]
            entries += [{m: f"api/{m}.md"} for m in engine]
            if kernels:
                entries.append({"Kernels": [{m: f"api/{m}.md"} for m in kernels]})
    if config.use_directory_urls:
        # Figures inside recorded HTML outputs (mo.vstack([fig, ...])) use page-relative URLs
        # that mkdocs does not rewrite; they resolve only with flat URLs (the offline plugin).
        log.warning("use_directory_urls must be false (keep the offline plugin enabled)")
    # Material's offline plugin loads a polyfill from a CDN; serve our vendored copy instead.
    polyfills = config.extra.get("polyfills", [])
    config.extra["polyfills"] = [
        "assets/vendor/iframe-worker-shim.js" if "iframe-worker" in p else p for p in polyfills
    ]
    return config


def on_serve(server, config, builder, **kwargs):
    """`mkdocs serve` rebuilds when a lesson or the engine changes, not only docs/."""
    for folder in (lesson_runner.LESSONS_DIR, REPO / "minivllm", REPO / "kernels"):
        if Path(folder).is_dir():
            server.watch(str(folder))
    return server


# ----------------------------------------------------------------------------- generated pages


def on_files(files: Files, config, **kwargs) -> Files:
    for num, path in sorted(_lessons.items()):
        _add_lesson(files, config, path)
    for module in _modules:
        files.append(File.generated(config, f"api/{module}.md", content=_api_page(module)))
    return files


def _add_lesson(files: Files, config, path: Path) -> None:
    run, note = None, None
    if LESSON_MODE in ("run", "cached"):
        run = lesson_runner.run_lesson(
            path, execute=(LESSON_MODE == "run"), allow_stale=(LESSON_MODE == "cached")
        )
        if run is not None:
            log.info(run.summary())
            if run.stale:
                note = (
                    "This run is out of date: the notebook or the engine changed since. "
                    "Build with MINIVLLM_DOCS_LESSONS=run to refresh it."
                )
    page = lesson_page.render_page(
        path,
        run,
        figure_prefix=f"figures/{path.stem}",
        source_path=f"lessons/{path.name}",
        note=note,
    )
    _titles[path.name[:2]] = page.title
    for problem in page.problems:
        # A lesson that fails must not publish quietly: a strict build stops here.
        log.warning(f"lesson {path.name}: {problem} (see build/lessons/{path.stem}/run.log)")
    files.append(File.generated(config, f"lessons/{path.stem}.md", content=page.markdown))
    for url, src in page.figures.items():
        files.append(File.generated(config, f"lessons/{url}", abs_src_path=str(src)))


def _api_page(module: str) -> str:
    return (
        f"# `{module}`\n\n"
        f"Source: `{module.replace('.', '/')}{'/__init__' if module == 'minivllm' else ''}.py`\n\n"
        f"::: {module}\n"
    )


# ----------------------------------------------------------------------------- page content


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    here = page.file.src_uri
    markdown = markdown.replace("<!-- course:lessons -->", _lessons_table(here))
    markdown = markdown.replace("<!-- course:ranking -->", _ranking_table(here))
    markdown = markdown.replace("<!-- api:modules -->", _api_table(here))
    markdown = markdown.replace("<!-- engine:modules -->", _module_map(here))
    if "--8<--" in markdown:
        markdown = _check_snippets(markdown, page.file.src_uri)
    return markdown


def _link(target: str, here: str) -> str:
    """Relative link from the page at src_uri `here` to the page at src_uri `target`."""
    return posixpath.relpath(target, posixpath.dirname(here) or ".")


def _lessons_table(here: str) -> str:
    rows = ["| # | Lesson | What it shows | Status |", "|---|---|---|---|"]
    for num, title, what in COURSE:
        path = _lessons.get(num)
        if path is None:
            rows.append(f"| {num} | {title} | {what} | coming |")
        else:
            link = _link(f"lessons/{path.stem}.md", here)
            rows.append(f"| {num} | [{title}]({link}) | {what} | "
                        f"`uv run marimo edit lessons/{path.name}` |")
    return "\n".join(rows)


def _ranking_table(here: str) -> str:
    rows = ["| Rank | Technique | What it buys | Lesson |", "|---|---|---|---|"]
    for rank, (name, num, what) in enumerate(RANKING, start=1):
        path = _lessons.get(num)
        lesson = f"[{num}]({_link(f'lessons/{path.stem}.md', here)})" if path else f"{num} (coming)"
        rows.append(f"| {rank} | {name} | {what} | {lesson} |")
    return "\n".join(rows)


def _api_table(here: str) -> str:
    if not _modules:
        return "*No engine modules yet.*"
    rows = ["| Module | What it is |", "|---|---|"]
    rows += [f"| [`{m}`]({_link(f'api/{m}.md', here)}) | {_module_summary(m)} |" for m in _modules]
    return "\n".join(rows)


def _module_map(here: str) -> str:
    rows = ["| Module | What it does | In vLLM | Lessons |", "|---|---|---|---|"]
    listed = set()
    for rel, what, vllm, lessons in MODULE_MAP:
        dotted = rel.removesuffix(".py").replace("/", ".")
        listed.add(dotted)
        if dotted in _modules:
            name = f"[`{rel}`]({_link(f'api/{dotted}.md', here)})"
        else:
            name = f"`{rel}` *planned*"
        links = ", ".join(_lesson_ref(n.strip(), here) for n in lessons.split(",") if n.strip())
        rows.append(f"| {name} | {what} | {vllm} | {links} |")
    for dotted in _modules:  # modules that exist but are not in the map yet
        if dotted not in listed and dotted != "minivllm":
            rel = dotted.replace(".", "/") + ".py"
            link = _link(f"api/{dotted}.md", here)
            rows.append(f"| [`{rel}`]({link}) | {_module_summary(dotted)} | | |")
    return "\n".join(rows)


def _lesson_ref(num: str, here: str) -> str:
    path = _lessons.get(num)
    return f"[{num}]({_link(f'lessons/{path.stem}.md', here)})" if path else num


def _module_summary(module: str) -> str:
    """First line of the module's docstring."""
    rel = module.replace(".", "/")
    path = REPO / (rel + "/__init__.py" if (REPO / rel).is_dir() else rel + ".py")
    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    except (OSError, SyntaxError):
        doc = ""
    return doc.strip().splitlines()[0].replace("|", "\\|") if doc.strip() else ""


_SNIPPET = re.compile(r'^(?P<indent>[ \t]*)--8<--\s+"(?P<file>[^":]+)(?::(?P<section>[\w-]+))?"\s*$',
                      re.M)


def _check_snippets(markdown: str, src_uri: str) -> str:
    """Let pymdownx.snippets include only what exists; say clearly what does not."""

    def check(m: re.Match[str]) -> str:
        indent, rel, section = m.group("indent"), m.group("file"), m.group("section")
        path = REPO / rel
        if not path.is_file():
            log.info(f"{src_uri}: {rel} is not written yet; showing a note instead")
            return (
                f'{indent}!!! note "Not written yet"\n\n'
                f"{indent}    `{rel}` does not exist yet; this excerpt appears once it does."
            )
        if section:
            text = path.read_text(encoding="utf-8")
            if f"[start:{section}]" not in text or f"[end:{section}]" not in text:
                log.warning(
                    f"{src_uri}: {rel} has no snippet section '{section}': add "
                    f"'# --8<-- [start:{section}]' and '# --8<-- [end:{section}]' around the lines"
                )
        return m.group(0)

    return _SNIPPET.sub(check, markdown)
