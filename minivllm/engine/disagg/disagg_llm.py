"""DisaggLLM: the front of a disaggregated pair, the launcher that starts both roles, and the
decode role's loop (vLLM twin: the disaggregated-serving proxy,
examples/online_serving/disaggregated_serving/, with one server per role in vLLM).

    with launch(max_model_len=1024) as llm:       # spawns the decode role on this machine
        outs = llm.generate(prompts, SamplingParams(temperature=0))
        llm.stats()                 # bytes and transfers, tokens not sent, re-prefills

On two machines, the decode side runs `minivllm disagg --role consumer --kv-ip HOST --kv-port
PORT` and the front `minivllm disagg --role producer --kv-ip HOST --kv-port PORT --prompt ...`
(HOST: the producer's address, which the consumer must reach; PORT: any free port there), or
the HTTP front `minivllm serve --kv-transfer-config '{"kv_role": "kv_producer", "kv_ip": HOST,
"kv_port": PORT}'` (without kv_port, `serve` spawns the consumer here): entrypoints/cli.py.

DisaggLLM lives in the producer's process and owns its engine. It adds each request with
kv_transfer_params={"do_remote_decode": True}: the engine's KV connector sends the prompt's K/V
once the first token is sampled (minivllm/distributed/kv_transfer/kv_connector.py), and the
front, seeing that first token and the request in the pipe's `sent`, drops the request here
and relays what the consumer streams back. It never touches a KV cache. It answers LLMEngine's
driving calls (add_request, step, has_unfinished_requests, abort_request, num_steps, trace), so the
shared driver `workloads.serve(llm, requests)` serves a workload through it unchanged; TTFT is
the producer's (arrival to first token), inter-token latencies are the consumer's (measured
where the decode runs). The consumer process streams every step's outputs back.

Left out, compared with vLLM's disaggregated serving: one server per role and the proxy that
routes between many prefill and decode instances; here one pair, one front, in-process.
"""

from __future__ import annotations

import atexit
import dataclasses
import itertools
import logging
import signal
import socket
import time
import weakref
from collections import deque
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp

from minivllm.distributed.kv_transfer.kv_pipe import (ABORT, BYE, ERROR, KV, OUTPUTS, REJECT,
                                                      REPORT, SHUTDOWN, get_kv_pipe)
from minivllm.engine.core import EngineCoreRequest
from minivllm.engine.llm_engine import LLMEngine
from minivllm.engine.processor import validate_request
from minivllm.outputs import RequestMetrics, RequestOutput
from minivllm.sampling_params import SamplingParams

logger = logging.getLogger("minivllm")


def add_prefilled_request(engine: LLMEngine, request_id: str, prompt_token_ids: list[int],
                          params: SamplingParams, first_token: int,
                          first_logprobs: dict[int, float] | None = None,
                          kv_transfer_params: dict | None = None) -> bool:
    """The consumer's way in: a request the producer prefilled, admitted
    by the scheduler's normal checks (EngineCore.add_prefilled_request); the KV connector loads
    the K/V kv_transfer_params describes ({"cached": tokens not sent}), and it runs from its
    first token on. False, with nothing changed, when there is no room for it now."""
    if engine.output_processor.in_use(request_id):
        raise ValueError(f"request_id {request_id!r} is already in use")
    validate_request(prompt_token_ids + [first_token], params, engine.vllm_config,
                     engine.engine_core.info)
    request = EngineCoreRequest(request_id, list(prompt_token_ids), params,
                                kv_transfer_params=kv_transfer_params)
    first = engine.core.add_prefilled_request(request, (first_token, first_logprobs))
    if first is None:
        return False
    engine.output_processor.add_request(request_id, None, prompt_token_ids, params,
                                        request.arrival_time)
    engine.output_processor.process_outputs(first)        # the first token's text
    return True


@dataclass(slots=True)
class Handoff:
    """A request whose decode runs on the consumer: what the front needs to finish it."""

    prompt: str | None                       # the text, if the prompt was given as text
    prompt_token_ids: list[int]
    params: SamplingParams
    metrics: RequestMetrics                  # the producer's: arrival, first token


class DisaggLLM:
    def __init__(self, model: str | None = None, *, kv_ip: str = "127.0.0.1",
                 kv_port: int = 14579, timeout: float = 120.0, consumer_process=None,
                 **engine_kwargs):
        config = {"kv_connector": "TorchDistributedConnector", "kv_role": "kv_producer",
                  "kv_ip": kv_ip, "kv_port": kv_port,
                  "kv_connector_extra_config": {"timeout": timeout}}
        self.consumer_process = consumer_process
        self.producer = LLMEngine(model, kv_transfer_config=config, **engine_kwargs)
        self.tokenizer = self.producer.tokenizer
        self.conn = get_kv_pipe()                # the pipe the producer's worker made
        self.remote: dict[str, Handoff] = {}     # decoding on the consumer
        self.parts: dict[str, list] = {}         # n > 1: each sample's latest output
        self.handing: dict[str, SamplingParams] = {}   # to hand off after their first token
        self.connected, self.error, self.report = True, None, None
        self.num_reprefilled = self.num_steps = 0
        self._last_heard = time.monotonic()
        self._counter = itertools.count()
        # A pair left open at exit: its receiving thread would still wait in gloo while the
        # interpreter tears the process group down ("terminate called without an active
        # exception"). Close it first, so that thread has returned.
        atexit.register(lambda ref=weakref.ref(self): ref() and ref().close())

    def __repr__(self) -> str:
        return f"DisaggLLM(producer={self.producer!r}, connected={self.connected})"

    def __enter__(self) -> DisaggLLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ LLMEngine's calls
    def add_request(self, request_id: str, prompt: str | list[int],
                    params: SamplingParams | None = None) -> None:
        params = params or SamplingParams()
        if params.n > 1:     # vLLM V1's fan-out: n requests of one sample, seeded seed + i as
            self.parts[request_id] = [None] * params.n     # the engine seeds sample i
            for i in range(params.n):
                self.add_request(f"{request_id}#{i}", prompt, dataclasses.replace(
                    params, n=1, seed=None if params.seed is None else params.seed + i))
            return
        if request_id in self.remote:
            raise ValueError(f"request_id {request_id!r} is already in use")
        remote = self.connected and params.max_tokens > 1    # one token: nothing to decode
        self.producer.add_request(request_id, prompt, params, kv_transfer_params={
            "do_remote_decode": True} if remote else None)
        if remote:
            self.handing[request_id] = params

    def has_unfinished_requests(self) -> bool:
        return bool(self.remote) or self.producer.has_unfinished_requests()

    def abort_request(self, request_id: str) -> None:
        for i in range(len(self.parts.pop(request_id, []))):
            self.abort_request(f"{request_id}#{i}")
        self.handing.pop(request_id, None)
        if self.remote.pop(request_id, None) is not None and self.connected:
            self._send(ABORT, request_id)
        self.producer.abort_request(request_id)

    def trace(self):
        return self.producer.trace()             # the producer's steps (prefills, fallbacks)

    def step(self) -> list[RequestOutput]:
        """One producer step (prefills; a prompt done is handed to the consumer: its K/V went
        in that step), then every output the consumer has streamed back since. Waits a little
        when the producer is idle."""
        outs = []
        for out in self.producer.step() if self.producer.has_unfinished_requests() else []:
            rid = out.request_id
            params = self.handing.pop(rid, None)
            if rid in self.conn.sent:            # its K/V went with its first token
                self.conn.sent.discard(rid)
                self._last_heard = time.monotonic()  # the consumer's silence counts from here
                if out.finished:                 # it stopped there: nothing to decode
                    self._send(ABORT, rid)
                else:
                    self.remote[rid] = Handoff(out.prompt, out.prompt_token_ids, params,
                                               out.metrics)
                    self.producer.abort_request(rid)  # its blocks: back to the pool (and cache)
            outs.append(out)
        idle = not self.producer.has_unfinished_requests()
        for kind, payload, _ in self.conn.poll(0.05 if idle and self.connected else 0):
            self._last_heard = time.monotonic()
            if kind == OUTPUTS:
                outs += [self._from_consumer(o) for o in payload if o.request_id in self.remote]
            elif kind == REJECT:
                self._reprefill(payload[0], f"the kv_consumer refused it: {payload[1]}")
            elif kind in (BYE, REPORT):
                self.report = payload
            elif kind == ERROR:
                self._lose_consumer(payload)
        if self.remote and self.connected and (
                time.monotonic() - self._last_heard > self.conn.timeout
                or (self.consumer_process and not self.consumer_process.is_alive())):
            self._lose_consumer(f"the kv_consumer is gone (silent for "
                                f"{time.monotonic() - self._last_heard:.0f} s or exited)")
        self.num_steps += 1
        return self._merge(outs) if self.parts else outs

    def _merge(self, outs: list[RequestOutput]) -> list[RequestOutput]:
        """The outputs of an n > 1 request's samples, as one output with n completions."""
        merged = []
        done = set()
        for out in outs:
            parent, _, i = out.request_id.rpartition("#")
            if parent not in self.parts:
                merged.append(out)
                continue
            out.outputs[0].index = int(i)
            self.parts[parent][int(i)] = out
            done.add(parent)
        for parent in [p for p in done if all(self.parts[p])]:
            parts = self.parts[parent]
            merged.append(dataclasses.replace(parts[0], request_id=parent, outputs=[
                p.outputs[0] for p in parts], finished=all(p.finished for p in parts)))
            if merged[-1].finished:
                del self.parts[parent]
        return merged

    def _send(self, kind: int, payload) -> None:
        try:
            self.conn.send(kind, payload)
        except Exception as e:  # noqa: BLE001
            self._lose_consumer(f"the kv_consumer does not answer: {e}")

    def _from_consumer(self, out: RequestOutput) -> RequestOutput:
        h = self.remote[out.request_id]
        out.prompt = h.prompt
        out.prompt_token_ids = h.prompt_token_ids
        out.metrics = dataclasses.replace(
            h.metrics, finished_time=time.perf_counter() if out.finished else None)
        if out.finished:
            del self.remote[out.request_id]
        return out

    def _reprefill(self, request_id: str, why: str) -> None:
        """Not lost: prefill it again here, and decode it here (its output restarts)."""
        h = self.remote.pop(request_id)
        logger.warning("request %s: %s; prefilling it again on the kv_producer", request_id, why)
        self.producer.add_request(    # the text, if given as text: same ids, and it is shown;
            request_id, h.prompt if h.prompt is not None else h.prompt_token_ids, h.params)
        # no kv_transfer_params: it decodes here
        self.num_reprefilled += 1

    def _lose_consumer(self, why: str) -> None:
        if self.connected:
            logger.error("%s; decoding on the kv_producer from now on", why)
        self.connected = False
        self.conn.broken = True                  # the engine's worker sends no more K/V
        self.error = why
        for request_id in list(self.remote):
            self._reprefill(request_id, why)

    # ------------------------------------------------------------------ LLM-like front
    def generate(self, prompts: list[str] | list[list[int]],
                 sampling_params: SamplingParams | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs in the order of `prompts`."""
        ids = [f"disagg-{next(self._counter)}" for _ in prompts]
        for rid, prompt in zip(ids, prompts):
            self.add_request(rid, prompt, sampling_params)
        done: dict[str, RequestOutput] = {}
        while len(done) < len(ids):
            for out in self.step():
                if out.finished and out.request_id in ids:
                    done[out.request_id] = out
        return [done[rid] for rid in ids]

    def stats(self) -> dict:
        c = self.conn
        return {"bytes_sent": c.bytes_sent, "num_transfers": c.num_sent,
                "cached_tokens_not_sent": c.cached_tokens,
                "transfer_seconds": c.transfer_seconds, "num_reprefilled": self.num_reprefilled,
                "connected": self.connected, "error": self.error}

    def _ask(self, kind: int) -> dict | None:
        """Send REPORT or SHUTDOWN, then step until the consumer's report is in (or `timeout`)."""
        if self.connected:
            self.report = None                   # not an earlier one: wait for this answer
            self._send(kind, None)
            deadline = time.monotonic() + self.conn.timeout
            while self.connected and self.report is None and time.monotonic() < deadline:
                self.step()
        return self.report

    def consumer_report(self) -> dict | None:
        """The consumer's counters now (bytes received, prefill steps, its pool's blocks);
        None once it is gone."""
        return self._ask(REPORT) if self.connected else None

    def close(self) -> dict | None:
        """Stop the consumer (it answers with its final report, returned) and join it, and
        our receiving thread (it returns on the consumer's BYE)."""
        self._ask(SHUTDOWN)
        self.connected = False
        self.conn.receiver.join(self.conn.timeout if self.report else 1)
        if self.consumer_process is not None:
            self.consumer_process.join(self.conn.timeout)
            if self.consumer_process.is_alive():
                self.consumer_process.kill()
                self.consumer_process.join(10)
            self.consumer_process = None
        return self.report


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(model: str | None = None, *, kv_ip: str = "127.0.0.1", kv_port: int | None = None,
           timeout: float = 120.0, consumer_kwargs: dict | None = None,
           **engine_kwargs) -> DisaggLLM:
    """Both roles on this machine: the consumer in a spawned process (torch.multiprocessing),
    the producer and the front here. consumer_kwargs override engine settings on the decode
    side only (its pool size, max_num_seqs, ...)."""
    kv_port = kv_port or free_port()
    if engine_kwargs.get("device", "auto") == "auto" and torch.cuda.device_count() > 1:
        consumer_kwargs = {"device": "cuda:1", **(consumer_kwargs or {})}   # a GPU of its own
    consumer_config = {"kv_connector": "TorchDistributedConnector", "kv_role": "kv_consumer",
                       "kv_ip": kv_ip, "kv_port": kv_port,
                       "kv_connector_extra_config": {"timeout": timeout}}
    proc = mp.get_context("spawn").Process(
        target=run_decode_role, name="minivllm-kv-consumer", daemon=True,
        args=(model, {**engine_kwargs, **(consumer_kwargs or {}),
                      "kv_transfer_config": consumer_config}, True))
    proc.start()
    try:
        return DisaggLLM(model, kv_ip=kv_ip, kv_port=kv_port, timeout=timeout,
                         consumer_process=proc, **engine_kwargs)
    except BaseException:
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
        raise


def run_decode_role(model: str | None, engine_kwargs: dict, spawned: bool = False) -> None:
    """A consumer process: build the engine (which meets the producer), serve, exit. A spawned
    one leaves Ctrl-C to its front, which stops it (or it stops when the front is gone)."""
    if spawned:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    serve_decode(LLMEngine(model, **engine_kwargs))


def serve_decode(engine) -> dict:
    """The consumer's loop: admit transferred requests when their blocks fit, decode, stream
    outputs back, until the producer says stop (or is gone). Returns the final report."""
    conn = get_kv_pipe()                        # the pipe this engine's worker made
    pending = deque()                           # received, waiting for room
    error = None
    # A prefill here would be a bug; the largest step a decode waited through is the
    # interference measure lesson 08 compares with colocated and chunked prefill.
    counts = {"num_steps": 0, "num_prefill_steps": 0, "largest_decode_step_tokens": 0}
    while True:
        msgs = conn.poll(0 if engine.has_unfinished_requests() or pending else 0.01)
        if any(kind in (SHUTDOWN, ERROR) for kind, _, _ in msgs):
            error = next((p for k, p, _ in msgs if k == ERROR), None)
            break
        for kind, payload, _ in msgs:
            if kind == KV:
                pending.append(payload)
            elif kind == ABORT:
                if any(m["request_id"] == payload for m in pending):   # its K/V: not needed
                    conn.received.pop(payload, None)
                pending = deque(m for m in pending if m["request_id"] != payload)
                engine.abort_request(payload)
            elif kind == REPORT:
                conn.send(REPORT, _report(engine, conn, counts, None))
        while pending:                          # first come, first served, as in `waiting`
            meta = pending[0]
            try:
                if not add_prefilled_request(
                        engine, meta["request_id"], meta["prompt_token_ids"], meta["params"],
                        meta["first_token"], meta["first_logprobs"], {"cached": meta["cached"]}):
                    break
            except ValueError as e:             # it can never run here: the producer keeps it
                conn.received.pop(meta["request_id"], None)
                conn.send(REJECT, (meta["request_id"], str(e)))
            pending.popleft()
        if engine.has_unfinished_requests():
            outs = engine.step()
            counts["num_steps"] += 1
            so = engine.last_scheduler_output
            counts["num_prefill_steps"] += so.num_prefill_tokens > 0
            if so.num_decode_tokens:
                counts["largest_decode_step_tokens"] = max(counts["largest_decode_step_tokens"],
                                                           so.num_batched_tokens)
            try:
                if outs:
                    conn.send(OUTPUTS, [dataclasses.replace(o, prompt=None,
                                                            prompt_token_ids=[]) for o in outs])
            except RuntimeError as e:           # the producer is gone: nobody to decode for
                error = f"sending outputs failed: {e}"
                break
    report = _report(engine, conn, counts, error)
    if error is None:
        conn.send(BYE, report)
    return report


def _report(engine, conn, counts: dict, error: str | None) -> dict:
    """The consumer's counters: bytes in, steps (and those that prefilled), its pool."""
    bm = engine.block_manager
    return {"bytes_received": conn.bytes_received, "num_received": conn.num_received,
            "receive_seconds": conn.transfer_seconds, **counts,
            "num_blocks": bm.num_blocks, "num_free_blocks": bm.num_free_blocks,
            "num_referenced_blocks": sum(c > 0 for c in bm.ref_counts),
            "stats": dataclasses.asdict(engine.stats()), "error": error}
