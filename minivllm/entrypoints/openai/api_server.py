"""An OpenAI-compatible HTTP server over AsyncLLMEngine (FastAPI + uvicorn), vLLM's in miniature
(vLLM twin: vllm/entrypoints/openai/api_server.py).

    POST /v1/completions        prompt(s) -> text; `stream: true` sends server-sent events
    POST /v1/chat/completions   messages -> the model's chat template -> text
    GET  /v1/models   /health   /metrics (Prometheus text)

One request's path: the handler validates the body (pydantic, then SamplingParams), tokenizes
the prompt, checks it against max_model_len, and adds it to the engine; it then reads the
request's stream of RequestOutputs and sends each new piece of text as an SSE chunk. The
engine's loop runs on its own thread (minivllm/engine/async_llm_engine.py), and `minivllm
serve` puts its EngineCore in a process of its own (engine/multiproc/), so the event loop
stays free to accept connections and flush tokens while a forward pass runs. A client that
goes away (stream or not) aborts its request; its KV blocks are freed before the next step.

Errors use OpenAI's JSON shape, {"error": {"message", "type", "param", "code"}}, every one of
them: 400 for bad JSON (invalid UTF-8 and nesting too deep included), unknown or bad fields
and prompts too long (with the numbers), 401 without the API key, 404 for an unknown model or
path, 405 for a wrong method, 413 for a body over --max-request-body-mb (refused as it arrives,
before it is parsed: one 50 MB body once cost 12.7 GB), 503 once the engine loop has died,
and 500 (logged) for a bug of ours.

Left out, compared with vLLM: tools, the responses API, embeddings, LoRA routing, the
tokenizer endpoints, and more than one model per server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import hmac
import logging
import socket
import time
from collections.abc import AsyncIterator
from functools import lru_cache

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from minivllm.engine.async_llm_engine import AsyncLLMEngine, EngineDeadError
from minivllm.outputs import RequestOutput
from minivllm.entrypoints.openai.protocol import (OpenAIError, RequestLimits, cut, error_body,
                                                  now)
from minivllm.entrypoints.openai.serving import add_routes, max_token_chars

logger = logging.getLogger("minivllm")


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """pydantic's errors, as one line that names each field and the value it got."""
    parts = []
    param = None
    for err in exc.errors()[:3]:
        if err["type"] == "json_invalid":
            return (f"malformed JSON body: {err.get('ctx', {}).get('error', err['msg'])} "
                    f"(at character {err['loc'][-1]})", None)
        # drop 'body' and the union-member tags pydantic adds ('str', 'list[int]', ...)
        loc = [str(x) for x in err["loc"][1:] if not (isinstance(x, str) and (
            "[" in x or x in ("str", "int", "float", "bool", "list", "dict")))]
        field = ".".join(loc) or "body"
        param = param or field
        got = "" if err["type"] == "missing" else f", got {cut(repr(err.get('input')))}"
        parts.append(f"{field}: {err['msg']}{got}")
    return "; ".join(dict.fromkeys(parts)), param


# --------------------------------------------------------------------------- metrics
class EngineCollector:
    """The engine's state at scrape time, with vLLM's metric names under `minivllm:`."""

    def __init__(self, aengine: AsyncLLMEngine):
        self.aengine = aengine

    def collect(self):
        s = self.aengine.stats()
        for name, doc, field in [
                ("num_requests_running", "Sequences in the running batch.", "num_running"),
                ("num_requests_waiting", "Sequences waiting to be admitted.", "num_waiting"),
                ("kv_cache_usage_perc", "Share of KV blocks in use (0-1).", "kv_cache_usage"),
                ("kv_offload_usage_perc", "Share of CPU tier blocks in use.", "kv_offload_usage"),
                ("prefix_cache_hit_rate", "Prompt tokens found in the prefix cache (0-1).",
                 "prefix_cache_hit_rate")]:
            yield GaugeMetricFamily(f"minivllm:{name}", doc, value=getattr(s, field))
        for name, doc, field in [
                ("num_preemptions", "Preemptions since start.", "num_preemptions"),
                ("prefix_cache_queries", "Prompt tokens looked up.", "prefix_cache_queried_tokens"),
                ("prefix_cache_hits", "Prompt tokens found.", "prefix_cache_hit_tokens"),
                ("external_prefix_cache_queries", "Prompt tokens looked up in the CPU tier.",
                 "external_prefix_cache_queried_tokens"),
                ("external_prefix_cache_hits", "Prompt tokens loaded from the CPU tier.",
                 "external_prefix_cache_hit_tokens"),
                ("kv_offload_store_bytes", "Bytes to the CPU tier (one device's).",
                 "kv_offload_store_bytes"),
                ("kv_offload_load_bytes", "Bytes from the CPU tier (one device's).",
                 "kv_offload_load_bytes")]:
            yield CounterMetricFamily(f"minivllm:{name}", doc, value=getattr(s, field))
        replicas = self.aengine.replica_stats()
        if len(replicas) > 1:        # data parallelism: each replica too, labelled as in vLLM
            for name, doc, field in [
                    ("num_requests_running", "Sequences running, per replica.", "num_running"),
                    ("num_requests_waiting", "Sequences waiting, per replica.", "num_waiting"),
                    ("kv_cache_usage_perc", "Share of KV blocks in use, per replica.",
                     "kv_cache_usage")]:
                family = GaugeMetricFamily(f"minivllm:{name}_by_engine", doc, labels=["engine"])
                for i, r in enumerate(replicas):
                    family.add_metric([str(i)], getattr(r, field))
                yield family


class BodyLimit:
    """ASGI middleware: a body over `max_bytes` is a 413 as soon as its length is known (its
    Content-Length, or the bytes received so far when it comes in chunks), before any of it
    is parsed."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    def error(self) -> HTTPException:
        return HTTPException(413, f"the request body is larger than this server takes "
                                  f"({self.max_bytes} bytes, --max-request-body-mb)")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.max_bytes:
            e = self.error()
            response = JSONResponse(error_body(413, e.detail), status_code=413)
            return await response(scope, receive, send)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise self.error()            # FastAPI passes an HTTPException through
            return message
        await self.app(scope, limited_receive, send)


def _parse_error(e: HTTPException) -> str:
    """FastAPI's one message for a body it could not parse, made to say why."""
    cause = e.__cause__
    if isinstance(cause, RecursionError):
        return "malformed JSON body: nested too deeply for the parser"
    if isinstance(cause, UnicodeDecodeError):
        return f"malformed JSON body: not valid UTF-8 ({cause.reason} at byte {cause.start})"
    return f"malformed JSON body: {e.detail}" + (f" ({cause!r})" if cause else "")


class ServerMetrics:
    LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80)

    def __init__(self, aengine: AsyncLLMEngine):
        self.registry = CollectorRegistry()       # one per app: tests may build several
        self.registry.register(EngineCollector(aengine))
        h = lambda name, doc: Histogram(f"minivllm:{name}", doc, registry=self.registry,  # noqa
                                        buckets=self.LATENCY_BUCKETS)
        self.ttft = h("time_to_first_token_seconds", "Request arrival to its first token.")
        self.itl = h("inter_token_latency_seconds", "Between two tokens of one sequence.")
        self.e2e = h("e2e_request_latency_seconds", "Request arrival to its last token.")
        self.prompt_tokens = Counter("minivllm:prompt_tokens", "Prompt tokens received.",
                                     registry=self.registry)
        self.generation_tokens = Counter("minivllm:generation_tokens", "Tokens generated.",
                                         registry=self.registry)
        self.requests = Counter("minivllm:request_success", "Requests finished, by reason.",
                                ["finished_reason"], registry=self.registry)

    async def observe(self, outputs: AsyncIterator[RequestOutput], t0: float):
        """Pass a request's outputs through, timing them from `t0` (the request's arrival).
        A request that ends without its finished output (the client left, the engine died)
        counts as finished_reason="abort"."""
        first = True
        finished = False
        try:
            async for out in outputs:
                if first and any(c.token_ids for c in out.outputs):
                    self.ttft.observe(time.perf_counter() - t0)
                    first = False
                if out.finished:
                    finished = True
                    self.e2e.observe(time.perf_counter() - t0)
                    for dt in out.inter_token_latencies:
                        self.itl.observe(dt)
                    self.prompt_tokens.inc(len(out.prompt_token_ids))
                    for c in out.outputs:
                        self.generation_tokens.inc(len(c.token_ids))
                        self.requests.labels(c.finish_reason).inc()
                yield out
        finally:
            if not finished:
                self.requests.labels("abort").inc()
            await outputs.aclose()


# --------------------------------------------------------------------------- the app
def build_app(aengine: AsyncLLMEngine, served_model_name: str, api_key: str | None = None,
              max_request_body_mb: float = 16, max_prompts_per_request: int = 256,
              disable_fastapi_docs: bool = False) -> FastAPI:
    docs = {"docs_url": None, "redoc_url": None, "openapi_url": None} \
        if disable_fastapi_docs else {}
    app = FastAPI(title="minivllm", version="0.1.0", **docs)
    app.add_middleware(BodyLimit, max_bytes=int(max_request_body_mb * 2**20))
    app.state.aengine = aengine
    app.state.model_name = served_model_name
    app.state.metrics = ServerMetrics(aengine)
    config = aengine.engine.vllm_config
    app.state.limits = RequestLimits(config.model_config.max_model_len,
                                     config.scheduler_config.max_num_seqs,
                                     max_prompts_per_request)
    tokenizer = aengine.tokenizer
    app.state.max_token_chars = max_token_chars(tokenizer)

    @lru_cache(maxsize=1 << 16)
    def decode_token(token_id: int) -> str:
        return tokenizer.decode([token_id])
    app.state.decode_token = decode_token

    @app.exception_handler(OpenAIError)
    async def _openai_error(_, e: OpenAIError):
        return JSONResponse(error_body(e.status, e.message, e.param), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_, e: RequestValidationError):
        message, param = _validation_message(e)
        return JSONResponse(error_body(400, message, param), status_code=400)

    @app.exception_handler(EngineDeadError)
    async def _dead(_, e: EngineDeadError):
        return JSONResponse(error_body(503, str(e)), status_code=503)

    @app.exception_handler(HTTPException)       # 404, 405, 413, bodies FastAPI cannot parse
    async def _http(_, e: HTTPException):
        message = _parse_error(e) if e.status_code == 400 else str(e.detail)
        return JSONResponse(error_body(e.status_code, message), status_code=e.status_code,
                            headers=e.headers)

    @app.exception_handler(Exception)           # a bug of ours: logged, and still OpenAI's shape
    async def _bug(_, e: Exception):
        logger.exception("internal error")
        return JSONResponse(error_body(500, f"internal server error: {e!r}"), status_code=500)

    expected = f"Bearer {api_key}".encode() if api_key else None

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if expected and request.url.path.startswith("/v1") and not hmac.compare_digest(
                request.headers.get("authorization", "").encode(), expected):  # constant time
            return JSONResponse(error_body(401, "invalid or missing API key: send "
                                           "'Authorization: Bearer <key>'"), status_code=401)
        return await call_next(request)

    @app.get("/health")
    async def health():
        if not aengine.is_running:
            return JSONResponse(error_body(503, "the engine loop has stopped"), status_code=503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(app.state.metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)

    def model_card() -> dict:
        return {"id": served_model_name, "object": "model", "created": now(),
                "owned_by": "minivllm", "max_model_len": aengine.engine.model_config.max_model_len}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")         # the openai client's models.retrieve
    async def model(model_id: str):
        if model_id != served_model_name:
            raise OpenAIError(404, f"The model `{cut(model_id)}` does not exist; this server "
                              f"serves `{served_model_name}`.", "model")
        return model_card()

    add_routes(app)
    return app




class DisaggFront:
    """A disaggregated pair (minivllm/engine/disagg/disagg_llm.py: DisaggLLM, the producer's engine and the
    front) as AsyncLLMEngine drives an engine. The server is the same; its /metrics show the
    producer's queue and pool, with the requests decoding on the consumer counted as running."""

    def __init__(self, llm):
        self.llm = llm
        self.model_config = llm.producer.model_config
        self.vllm_config = llm.producer.vllm_config
        self.tokenizer = llm.tokenizer

    def __getattr__(self, name):          # add_request, step, abort_request, close, ...
        return getattr(self.llm, name)

    def __repr__(self) -> str:
        return repr(self.llm)

    def shutdown(self) -> None:
        self.llm.close()

    def stats(self):
        s = self.llm.producer.stats()
        return dataclasses.replace(s, num_running=s.num_running + len(self.llm.remote))


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind the listening socket before the model loads, so a taken port fails at once, with
    a message that says what to do."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise SystemExit(f"minivllm serve: port {port} on {host} is already in use "
                             "(another server still running?); stop it or choose another "
                             "with --port") from None
        raise SystemExit(f"minivllm serve: cannot listen on {host}:{port}: {e.strerror}") \
            from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class Server:
    """uvicorn serving `app` on an already-bound socket; run() blocks, start() runs it on a
    thread (tests, lessons, the benchmark). Stopping lets streams in flight finish for up to
    `graceful_s` seconds, then cancels them; the engine loop then answers whatever is left."""

    def __init__(self, aengine: AsyncLLMEngine, sock: socket.socket, served_model_name: str,
                 api_key: str | None = None, graceful_s: float = 5.0, log_level="warning",
                 owns_engine: bool = True, **app_kwargs):
        self.aengine = aengine
        self.sock = sock
        self.owns_engine = owns_engine
        self.app = build_app(aengine, served_model_name, api_key, **app_kwargs)
        self.uvicorn = uvicorn.Server(uvicorn.Config(
            self.app, log_level=log_level, timeout_graceful_shutdown=graceful_s))
        self.thread = None

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{host}:{port}"

    def run(self) -> None:
        try:
            asyncio.run(self.uvicorn.serve(sockets=[self.sock]))
        finally:
            if self.owns_engine:        # answer what is still in flight, stop the loop
                self.aengine.shutdown()

    def start(self, timeout: float = 30.0) -> "Server":
        import threading
        self.thread = threading.Thread(target=self.run, name="minivllm-http", daemon=True)
        self.thread.start()
        t0 = time.perf_counter()
        while not self.uvicorn.started:
            if not self.thread.is_alive() or time.perf_counter() - t0 > timeout:
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.uvicorn.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout)
