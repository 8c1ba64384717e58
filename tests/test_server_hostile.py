"""The server under hostile input (issue 30): no request crashes it, stalls the other streams,
or keeps it busy after its client left; every error in OpenAI's shape. One uvicorn server on
127.0.0.1 for the module (the session's engine, reconfigured), driven over raw HTTP.

The fuzz test and the stall test, on a server of their own: tests/test_server_fuzz.py.
"""

import dataclasses
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from minivllm import SamplingParams
from minivllm.engine.async_llm_engine import AsyncLLMEngine
from minivllm.entrypoints.openai.api_server import Server, bind_socket

from conftest import PROMPTS, reconfigured, rss_mb, wait_idle

MODEL = "smol"
MAX_MODEL_LEN = 256
BODY_MB = 1.0
MAX_PROMPTS = 128
VOCAB = 49152


@pytest.fixture(scope="module")
def served(smol_llm):
    with reconfigured(smol_llm, max_model_len=MAX_MODEL_LEN, max_num_seqs=16) as llm:
        greedy = SamplingParams(temperature=0, max_tokens=6)
        ref = [o.outputs[0].text for o in llm.generate(PROMPTS[:2], greedy, use_tqdm=False)]
        aengine = AsyncLLMEngine(llm.engine)
        server = Server(aengine, bind_socket("127.0.0.1", 0), MODEL, graceful_s=1.0,
                        max_request_body_mb=BODY_MB,
                        max_prompts_per_request=MAX_PROMPTS).start()
        yield server, aengine, ref
        server.stop()


def call(server, method: str, path: str, body: bytes | dict | None = None,
         headers: dict | None = None, timeout: float = 120) -> tuple[int, dict | bytes]:
    """One request on a fresh connection to `server` (a Server, or a port on 127.0.0.1)
    -> (status, JSON body or raw bytes)."""
    host, port = ("127.0.0.1", server) if isinstance(server, int) else \
        server.sock.getsockname()[:2]
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    try:
        conn.request(method, path, body=data, headers={"Content-Type": "application/json",
                                                       **(headers or {})})
        r = conn.getresponse()
        raw = r.read()
    finally:
        conn.close()
    try:
        return r.status, json.loads(raw)
    except ValueError:
        return r.status, raw


def assert_openai_error(status, body, code):
    assert status == code, (status, body)
    assert isinstance(body, dict) and set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["code"] == code and body["error"]["message"], body


def healthy(server) -> bool:
    return call(server, "GET", "/health", timeout=30)[0] == 200


# ---------------------------------------------------------------- one item each
def test_body_over_the_limit_is_413_before_parsing(served):
    server, aengine, _ = served
    big = json.dumps({"prompt": "x" * int(2 * BODY_MB * 2**20)}).encode()
    status, body = call(server, "POST", "/v1/completions", big)
    assert_openai_error(status, body, 413)
    assert f"{int(BODY_MB * 2**20)} bytes" in body["error"]["message"]
    # Chunked (no Content-Length): refused once the bytes received pass the limit.
    host, port = server.sock.getsockname()[:2]
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("POST", "/v1/completions", body=iter([big[i:i + 65536] for i in
                                                       range(0, len(big), 65536)]),
                 headers={"Content-Type": "application/json"}, encode_chunked=True)
    r = conn.getresponse()
    assert_openai_error(r.status, json.loads(r.read()), 413)
    conn.close()
    assert healthy(server)


def test_long_prompt_refused_without_tokenizing(served):
    """Under the body limit, but longer than max_model_len tokens of the longest token's
    characters could hold: a 400 that counts characters (the tokenizer never ran)."""
    server, _, _ = served
    status, body = call(server, "POST", "/v1/completions",
                        {"prompt": "ab" * 300_000, "max_tokens": 1})
    assert_openai_error(status, body, 400)
    assert "600000 characters" in body["error"]["message"] and body["error"]["param"] == "prompt"


def test_too_many_prompts_and_empty_prompt_list(served):
    server, aengine, _ = served
    status, body = call(server, "POST", "/v1/completions",
                        {"prompt": ["Hi"] * (MAX_PROMPTS + 1), "max_tokens": 1})
    assert_openai_error(status, body, 400)
    assert f"prompt: {MAX_PROMPTS + 1} is over this server's limit of {MAX_PROMPTS}" in body[
        "error"]["message"]
    status, body = call(server, "POST", "/v1/completions", {"prompt": [], "max_tokens": 1})
    assert_openai_error(status, body, 400)
    assert body["error"]["param"] == "prompt"
    status, body = call(server, "POST", "/v1/completions", {"prompt": ["Hi"] * MAX_PROMPTS,
                                                            "max_tokens": 1})
    assert status == 200 and len(body["choices"]) == MAX_PROMPTS


def test_many_prompts_then_disconnect_leaves_nothing(served):
    """The client gives up while its prompts are added: every one of them is aborted at once.
    (They were added one per engine step, and the client watched only after the last: 128
    prompts kept the engine busy for tens of seconds after the client left.)"""
    server, aengine, _ = served
    with pytest.raises(TimeoutError):
        call(server, "POST", "/v1/completions",
             {"prompt": [f"Story {i}:" for i in range(MAX_PROMPTS)], "max_tokens": 200,
              "ignore_eos": True}, timeout=1.0)
    t0 = time.perf_counter()
    s = wait_idle(aengine, timeout=120)
    took = time.perf_counter() - t0
    assert (s.num_running, s.num_waiting, s.num_blocks_used) == (0, 0, 0)
    print(f"many prompts: the engine let go {took:.2f} s after the client left")
    assert took < 2.5, f"the engine let go {took:.1f} s after the client left"


HI = [{"role": "user", "content": "Hi"}]
SIZING = [      # every field that sizes work, far past its limit: (path, body, field named)
    ("/v1/completions", {"prompt": "Hi", "n": 10**9}, "n"),
    ("/v1/completions", {"prompt": "Hi", "n": 2**63}, "n"),
    ("/v1/completions", {"prompt": "Hi", "n": 10**9, "use_beam_search": True,
                         "temperature": 0}, "n"),
    ("/v1/completions", {"prompt": ["Hi"] * 9, "n": 16}, "n"),     # 144 sequences
    ("/v1/chat/completions", {"messages": HI, "n": 10**9, "stream": True}, "n"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2**63}, "max_tokens"),
    ("/v1/chat/completions", {"messages": HI, "max_completion_tokens": 10**9}, "max_tokens"),
    ("/v1/completions", {"prompt": "Hi", "logprobs": 10**9}, "logprobs"),
    ("/v1/chat/completions", {"messages": HI, "logprobs": True, "top_logprobs": 2**63},
     "top_logprobs"),
    ("/v1/completions", {"prompt": "Hi", "stop": ["x"] * 5000}, "stop"),
    ("/v1/completions", {"prompt": "Hi", "stop": "s" * 5000}, "stop"),
    ("/v1/completions", {"prompt": "Hi", "stop_token_ids": [1] * 5000}, "stop_token_ids"),
    ("/v1/completions", {"prompt": "Hi", "logit_bias": {str(i): 1 for i in range(5000)}},
     "logit_bias"),
    ("/v1/chat/completions", {"messages": HI * (MAX_MODEL_LEN + 1)}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}] * 5000}]}, "messages"),
]


def test_every_sizing_field_is_bounded_before_allocation(served):
    """Each field that sizes work is a 400 naming it and its limit, with nothing built from
    it: the server's memory does not grow, it stays healthy, and nothing is left queued."""
    server, aengine, _ = served
    before = rss_mb()
    for path, body, field in SIZING:
        status, answer = call(server, "POST", path, body)
        assert_openai_error(status, answer, 400)
        assert answer["error"]["param"] == field, (field, answer)
        assert any(words in answer["error"]["message"] for words in (
            "limit of", "less than", "maximum context length")), answer
    grew = rss_mb() - before
    print(f"{len(SIZING)} sizing fields refused; RSS grew {grew:.0f} MB")
    assert grew < 200 and healthy(server)
    s = wait_idle(aengine)
    assert (s.num_running, s.num_waiting, s.num_blocks_used) == (0, 0, 0)


def test_logprob_entries_are_bounded_across_samples_and_tokens(served):
    """n x max_tokens x (logprobs + 1) entries are held, and answered, at once: past
    max_logprob_entries a 400 before any request is queued (1,000,000 by default; lowered
    here, since this server's max_model_len and max_num_seqs cannot reach it)."""
    server, aengine, _ = served
    limits = server.app.state.limits
    server.app.state.limits = dataclasses.replace(limits, max_logprob_entries=1000)
    try:
        status, body = call(server, "POST", "/v1/completions", {
            "prompt": "Hi", "n": 4, "max_tokens": 20, "logprobs": 20})     # 1,680
        assert_openai_error(status, body, 400)
        assert "logprobs: 1,680 is over this server's limit of 1,000" in body["error"][
            "message"], body
        status, body = call(server, "POST", "/v1/chat/completions", {   # chat's default
            "messages": HI, "logprobs": True, "top_logprobs": 5})        # max_tokens: the rest
        assert_openai_error(status, body, 400)
        status, body = call(server, "POST", "/v1/completions", {
            "prompt": "Hi", "n": 2, "max_tokens": 20, "logprobs": 20})     # 840
        assert status == 200 and len(body["choices"]) == 2, body
    finally:
        server.app.state.limits = limits
    s = wait_idle(aengine)
    assert (s.num_running, s.num_waiting, s.num_blocks_used) == (0, 0, 0)


@pytest.mark.parametrize("field, value", [("temperature", 1e-300), ("temperature", 5e-324),
                                          ("top_p", 1e-300)])
def test_tiny_temperature_or_top_p_is_greedy(served, field, value):
    server, _, ref = served
    status, body = call(server, "POST", "/v1/completions",
                        {"prompt": PROMPTS[0], "max_tokens": 6, field: value, "seed": 1})
    assert status == 200 and body["choices"][0]["text"] == ref[0], body


@pytest.mark.parametrize("top_k", [2**63, 2**63 - 1, VOCAB + 1])
def test_top_k_past_the_vocabulary_is_400(served, top_k):
    server, _, _ = served
    status, body = call(server, "POST", "/v1/completions",
                        {"prompt": "Hi", "max_tokens": 2, "top_k": top_k})
    assert_openai_error(status, body, 400)
    assert body["error"]["param"] == "top_k" and str(VOCAB) in body["error"]["message"]


def test_lone_surrogate_is_400(served):
    server, _, _ = served
    for path, body in [("/v1/completions", b'{"prompt": "Hi \\ud800 there", "max_tokens": 1}'),
                       ("/v1/chat/completions",
                        b'{"messages": [{"role": "user", "content": "\\udfff"}], '
                        b'"max_tokens": 1}')]:
        status, answer = call(server, "POST", path, body)
        assert_openai_error(status, answer, 400)
        assert "surrogate" in answer["error"]["message"], answer


@pytest.mark.parametrize("method, path, body, code, words", [
    ("POST", "/v1/completions", b'{"prompt": "\xff\xfe", "max_tokens": 1}', 400, "UTF-8"),
    ("POST", "/v1/completions", b'{"prompt": "Hi", "guided_json": ' + b"[" * 100_000 +
     b"]" * 100_000 + b"}", 400, "nested too deeply"),
    ("GET", "/v1/completions", None, 405, "Method Not Allowed"),
    ("GET", "/v1/nope", None, 404, "Not Found"),
    ("DELETE", "/health", None, 405, "Method Not Allowed"),
])
def test_every_error_has_the_openai_shape(served, method, path, body, code, words):
    server, _, _ = served
    status, answer = call(server, method, path, body)
    assert_openai_error(status, answer, code)
    assert words in answer["error"]["message"], answer


def test_bounded_grammar_cache(served):
    """Past cache_limit_bytes, the least recently used grammar goes; a running request keeps
    its own, so its matcher never compiles again on the engine thread."""
    server, aengine, _ = served
    manager = aengine.engine.structured_output
    limit = manager.cache_limit_bytes
    compiled = manager.num_compiled
    manager.cache_limit_bytes = 1                    # nothing fits: nothing is kept
    try:
        status, body = call(server, "POST", "/v1/completions",
                            {"prompt": "Pick:", "max_tokens": 8, "temperature": 0,
                             "guided_choice": ["alpha", "beta"]})
        assert status == 200 and body["choices"][0]["text"] in ("alpha", "beta"), body
        assert manager.num_compiled == compiled + 1          # once: not again for the matcher
        assert len(manager.grammars) == 0 and manager.cache_bytes == 0
    finally:
        manager.cache_limit_bytes = limit
    status, body = call(server, "POST", "/v1/completions",
                        {"prompt": "Pick:", "max_tokens": 8, "guided_choice": ["x", "y"]})
    assert status == 200 and len(manager.grammars) == 1
    assert 0 < manager.cache_bytes <= limit


def test_metrics_count_disconnects_and_show_the_step_in_progress(served):
    server, aengine, _ = served

    def aborts() -> float:
        with urllib.request.urlopen(f"{server.url}/metrics") as r:
            text = r.read().decode()
        return sum(float(line.split(" ")[1]) for line in text.splitlines()
                   if line.startswith('minivllm:request_success_total{finished_reason="abort"}'))
    before = aborts()
    with pytest.raises(TimeoutError):
        call(server, "POST", "/v1/completions", {"prompt": "Tell me a story.",
                                                 "max_tokens": 200, "ignore_eos": True},
             timeout=1.0)
    wait_idle(aengine)
    deadline = time.perf_counter() + 10
    while aborts() < before + 1 and time.perf_counter() < deadline:
        time.sleep(0.05)
    assert aborts() == before + 1
    # While a step runs, the gauges already show its batch (not the last step's end).
    engine = aengine.engine
    seen = []

    def spy():          # called after the async engine's own refresh, before the forward pass
        seen.append((aengine.stats().num_running, aengine.stats().num_blocks_used))
    engine.add_schedule_callback(spy)
    try:
        status, _ = call(server, "POST", "/v1/completions",
                         {"prompt": "word " * 200, "max_tokens": 1})
    finally:
        engine.remove_schedule_callback(spy)
    assert status == 200
    assert seen and seen[0][0] == 1 and seen[0][1] > 0, seen


# ---------------------------------------------------------------- `minivllm serve` itself
def test_serve_key_from_env_no_docs_and_ctrl_c_exits_cleanly(smol_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MINIVLLM_API_KEY": "sesame"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "minivllm.entrypoints.cli", "serve", str(smol_path), "--port",
         str(port), "--max-model-len", "128", "--disable-fastapi-docs",
         "--uvicorn-log-level", "warning"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.perf_counter() + 180
        while time.perf_counter() < deadline:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.5)
        assert "sesame" not in " ".join(proc.args)           # not in `ps`
        assert call(port, "GET", "/v1/models")[0] == 401
        assert call(port, "GET", "/v1/models", headers={"Authorization": "Bearer sesam"}
                    )[0] == 401
        assert call(port, "GET", "/v1/models", headers={"Authorization": "Bearer sesame"}
                    )[0] == 200
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert_openai_error(*call(port, "GET", path), 404)
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "minivllm: token budget" in out, out       # measured: a CPU, no budget given
