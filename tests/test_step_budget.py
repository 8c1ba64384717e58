"""A long prompt must not freeze the other streams on a CPU: `minivllm serve`'s token budget,
measured at start-up so that one step stays under a stated time (entrypoints/step_budget.py).

The stall test serves the packaged model over HTTP, streams one request, and sends a prompt of
thousands of tokens beside it. With the fitted budget, every step that prefills a chunk of the
long prompt also decodes the stream's next token (counted in the core's trace), no step holds
more tokens than the budget, and the stream's largest gap between two chunks stays under a
bound that follows from the budget: the step bound it was fitted for, times a margin of three
for a shared, loaded CI machine. (At vLLM's server default of 2048 tokens, the gap measured
5.6 to 6.7 s on an Intel 2-core: docs/benchmarks.md.)
"""

import json
import math
import threading
import time
import urllib.request

import pytest

from minivllm.engine.async_llm_engine import AsyncLLMEngine
from minivllm.entrypoints.step_budget import MAX_BUDGET, fit_step_budget
from minivllm.entrypoints.openai.api_server import Server, bind_socket

from conftest import reconfigured, wait_idle

BOUND_S = 1.0                  # `minivllm serve`'s default --cpu-max-step-seconds
MARGIN = 3.0                   # for load from other tenants on a shared 2-core machine
MAX_MODEL_LEN = 4096
LONG_PROMPT = [1000 + i % 5000 for i in range(4000)]


def post(url: str, body: dict):
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=300)


@pytest.fixture(scope="module")
def budgeted(smol_llm):
    with reconfigured(smol_llm, max_model_len=MAX_MODEL_LEN) as llm:
        yield llm, fit_step_budget(llm.engine, BOUND_S)


def test_the_fitted_budget_is_the_engines_and_keeps_a_step_under_the_bound(budgeted):
    llm, fit = budgeted
    assert llm.engine.vllm_config.scheduler_config.max_num_batched_tokens == fit.budget
    assert 16 <= fit.budget < MAX_BUDGET, fit          # on a CPU, 2048 tokens take seconds
    assert fit.step_s(fit.budget) <= BOUND_S < fit.step_s(fit.budget + 16), fit
    assert fit.step_s(MAX_BUDGET) > BOUND_S, fit
    assert llm.engine.engine_args.enable_prefix_caching      # the probe's settings undone
    with pytest.raises(ValueError, match="positive"):
        fit_step_budget(llm.engine, 0)


def test_a_long_prompt_does_not_stall_a_stream(budgeted):
    llm, fit = budgeted
    aengine = AsyncLLMEngine(llm.engine)
    server = Server(aengine, bind_socket("127.0.0.1", 0), "smol", graceful_s=1.0).start()
    done: dict[str, float] = {}

    def long_request():
        t0 = time.perf_counter()
        with post(server.url, {"model": "smol", "prompt": LONG_PROMPT, "max_tokens": 1}) as r:
            done["tokens"] = json.load(r)["usage"]["prompt_tokens"]
        done["start"], done["end"] = t0, time.perf_counter()

    chunks: list[float] = []
    try:
        with llm.engine.trace() as steps:
            body = {"model": "smol", "prompt": "Once upon a time", "max_tokens": 1000,
                    "ignore_eos": True, "stream": True}
            with post(server.url, body) as stream:
                for line in stream:
                    if line.startswith(b"data: {"):
                        chunks.append(time.perf_counter())
                        if len(chunks) == 3:
                            sender = threading.Thread(target=long_request)
                            sender.start()
                        if "end" in done or len(chunks) > 900:
                            break
            sender.join(timeout=300)
        wait_idle(aengine)
    finally:
        server.stop()
    assert done["tokens"] == len(LONG_PROMPT), done
    stream_id = steps[0].scheduled[0].request_id
    chunked = [s for s in steps if any(q.is_prefill and q.request_id != stream_id
                                       for q in s.scheduled)]
    assert len(chunked) >= math.ceil(len(LONG_PROMPT) / fit.budget) - 1, len(chunked)
    assert all(s.num_batched_tokens <= fit.budget for s in steps)
    assert all(any(q.request_id == stream_id and not q.is_prefill for q in s.scheduled)
               for s in chunked), \
        "a step prefilled the long prompt without decoding the stream"
    during = [b - a for a, b in zip(chunks, chunks[1:]) if done["start"] <= b <= done["end"]]
    assert len(during) >= 3, (len(during), done)
    assert max(during) <= MARGIN * BOUND_S, (max(during), fit)
