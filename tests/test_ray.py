"""The Ray executor (minivllm/executor/ray_executor.py): the ranks as Ray actors on a local
Ray cluster give the tokens one process gives, under pipeline and tensor parallelism; without
Ray, the engine names the extra to install.

Ray is an optional extra (`uv sync --extra ray`); CI installs the default environment, so the
actor tests skip there (run them with `uv run --extra ray pytest tests/test_ray.py`)."""

import sys

import pytest

from minivllm import LLM, SamplingParams

from conftest import PROMPTS

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
SMALL = dict(max_model_len=256, num_kv_blocks=64)


def token_ids(llm, prompts, params=GREEDY):
    return [[o.token_ids for o in out.outputs]
            for out in llm.generate(prompts, params, use_tqdm=False)]


def test_without_ray_the_error_names_the_extra(tiny_checkpoint, monkeypatch):
    path, _ = tiny_checkpoint("llama")
    monkeypatch.setitem(sys.modules, "ray", None)          # `import ray` fails, as uninstalled
    with pytest.raises(ImportError, match=r"uv sync --extra ray"):
        LLM(str(path), pipeline_parallel_size=2, distributed_executor_backend="ray", **SMALL)


def test_ray_actors_match_one_process(tiny_checkpoint):
    ray = pytest.importorskip("ray", reason="the ray extra is not installed "
                                            "(uv sync --extra ray)")
    path, _ = tiny_checkpoint("llama")
    one = LLM(str(path), **SMALL)
    expected = token_ids(one, PROMPTS[:4])
    seeded = SamplingParams(n=2, temperature=0.8, seed=3, max_tokens=8)
    expected_seeded = token_ids(one, PROMPTS[:2], seeded)
    try:
        for split in (dict(pipeline_parallel_size=2), dict(tensor_parallel_size=2)):
            llm = LLM(str(path), distributed_executor_backend="ray", **split, **SMALL)
            try:
                executor = llm.engine.model_executor
                assert type(executor).__name__ == "RayDistributedExecutor"
                assert len(executor.workers) == 1               # the other rank, an actor
                assert token_ids(llm, PROMPTS[:4]) == expected
                assert token_ids(llm, PROMPTS[:2], seeded) == expected_seeded
            finally:
                llm.engine.shutdown()
    finally:
        ray.shutdown()
