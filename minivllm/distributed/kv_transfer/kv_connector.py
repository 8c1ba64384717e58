"""Prefill/decode disaggregation: prefill on one engine, decode on another, KV sent between.

A prefill is compute-bound (hundreds of tokens share every weight read) and a decode step is
memory-bound (one token per sequence); in one engine a long prefill stalls every running decode
for its whole step. Split them (DistServe, Splitwise; vLLM's KV connectors):

    front (DisaggLLM, in the producer's process)
      add_request ->  producer engine (kv_role "kv_producer", rank 0): prefill, first token
                        | KVConnector.send_kv: the prompt's K/V, every layer, only its P tokens
                        v (torch.distributed point-to-point: gloo on CPU, NCCL for GPU tensors)
                      consumer engine (kv_role "kv_consumer", rank 1): add_prefilled_request
                        takes blocks in its own pool, writes the K/V there, decodes on
      RequestOutput <- the consumer's outputs, every step, over the same connection

One message: a header (kind, payload bytes, K/V follows), a pickled payload, then a prompt's K/V
as one (layers, 2, tokens, kv_heads, head_dim) tensor, sent once the consumer's receiving
thread has answered how many leading prompt tokens its prefix cache holds (HAVE: a round trip,
not a decode step): (P - cached) x kv_bytes_per_token bytes, counted both sides. The first
token's sampler generator goes along, so a seeded request draws what it would in one engine.
Each role receives on a thread of its own (gloo's irecv makes no progress unless waited on), so
a transfer lands while the consumer decodes; every wait has a timeout.

Failures: a consumer that refuses a request (it can never fit its pool) or dies (its connection
closes, its process is gone, or it is silent for `timeout` seconds with requests in flight)
loses nothing: the front prefills those requests again on the producer, whose prefix cache
usually still holds the prompt, and decodes them there (their outputs restart from the first
token; greedy outputs are unchanged). A request whose KV could not be sent just keeps decoding
on the producer. A bad pairing (same role twice, no peer, different model, weights, dtype or
block_size) is refused when the engines start, on both sides, naming the difference.

Left out, compared with vLLM: layer-by-layer sending during the forward (save_kv_layer), NIXL /
RDMA and Mooncake transports, many producers and consumers behind a routing proxy (one front
owns the pair here: DisaggLLM, which `minivllm serve --kv-transfer-config` serves), TP ranks.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pickle
import queue
import socket
import threading
import time
from collections import deque
from datetime import timedelta

import torch
import torch.distributed as dist

from minivllm.sampling_params import SamplingParams
from minivllm.core.sequence import SequenceGroup

logger = logging.getLogger("minivllm")
KV, OUTPUTS, REJECT, ABORT, SHUTDOWN, BYE, ERROR, REPORT, HAVE = range(9)   # message kinds


class KVConnector:
    """One role's end of the connection; made by LLMEngine from config.kv_transfer_config."""

    def __init__(self, engine):
        self.engine = engine
        cfg = engine.config.kv_transfer_config
        self.role = cfg.kv_role
        self.rank = cfg.rank
        self.peer = 1 - cfg.rank
        self.peer_role = ("kv_producer", "kv_consumer")[self.peer]
        self.timeout = cfg.timeout
        self.where = f"{socket.gethostname()}/{engine.device}"
        self.bytes_sent = self.bytes_received = self.num_sent = self.num_received = 0
        self.cached_tokens = 0                    # prompt tokens not sent: the consumer had them
        self.transfer_seconds = 0.0               # producer: gather + send; consumer: receive
        store, peer = self._rendezvous(cfg)
        self.pg = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), self.rank, 2,
                                        timedelta(days=7))     # idle receives wait for long
        # KV between two GPUs goes over NCCL; anything else (CPUs, or both roles on one GPU,
        # which NCCL refuses) over gloo, through host memory.
        self.kv_pg = self.pg
        self.kv_device = torch.device("cpu")
        if "/cuda" in self.where and "/cuda" in peer["where"] and self.where != peer["where"]:
            torch.cuda.set_device(engine.device)
            self.kv_pg = dist.ProcessGroupNCCL(dist.PrefixStore("nccl", store), self.rank, 2)
            self.kv_device = engine.device
        self.inbox = queue.Queue()
        self.replies = queue.Queue()
        self.lock = threading.Lock()
        self.receiver = threading.Thread(target=self._receive_loop, daemon=True, name="kv-recv")
        self.receiver.start()

    def _rendezvous(self, cfg) -> tuple[dist.TCPStore, dict]:
        """Meet the other role at kv_ip:kv_port and check that the two engines agree."""
        addr = f"{cfg.kv_ip}:{cfg.kv_port}"
        try:
            store = dist.TCPStore(cfg.kv_ip, cfg.kv_port, 2, is_master=self.rank == 0,
                                  timeout=timedelta(seconds=self.timeout), wait_for_workers=False)
        except Exception as e:  # noqa: BLE001 (a taken port, an unreachable host)
            raise RuntimeError(f"{self.role}: cannot {'listen on' if self.rank == 0 else 'reach'}"
                               f" {addr} (is another {self.role} there?): {e}") from None
        e = self.engine
        mine = {"role": self.role, "model": dataclasses.asdict(e.model_config),
                "weights": e.runner.model.model.embed_tokens.weight[:64].double().sum().item(),
                "dtype": str(e.dtype), "block_size": e.config.block_size, "where": self.where}
        store.set(f"info{self.rank}", json.dumps(mine))
        try:
            theirs = json.loads(store.get(f"info{self.peer}"))
            if self.rank == 1:
                store.set("ack", "1")             # the producer may leave once we have read
            else:
                store.wait(["ack"])
        except Exception:  # noqa: BLE001
            raise RuntimeError(f"{self.role}: no {self.peer_role} joined at {addr} within "
                               f"{self.timeout:.0f} s; start the other role with the same "
                               "kv_ip and kv_port") from None
        diff = [k for k in ("model", "weights", "dtype", "block_size") if mine[k] != theirs[k]]
        if theirs["role"] == self.role or diff:
            what = (f"both roles are {self.role}" if theirs["role"] == self.role else
                    "; ".join(f"{k}: {mine[k]} here, {theirs[k]} there" for k in diff))
            raise RuntimeError(f"{self.role}: refusing to pair with the engine at {addr}: "
                               f"{what}. Both roles need the same model, dtype and block_size, "
                               "one kv_producer and one kv_consumer")
        return store, theirs

    # ------------------------------------------------------------------ the wire
    def send(self, kind: int, payload, kv: torch.Tensor | None = None) -> None:
        """Blocking send (the peer always has a receive posted), at most `timeout` s. A KV
        message's tensor goes after the peer's HAVE: payload["kv_shape"] less what it holds."""
        data = torch.frombuffer(bytearray(pickle.dumps(payload)), dtype=torch.uint8)
        header = torch.tensor([kind, data.numel(), kv is not None])
        wait = timedelta(seconds=self.timeout)
        with self.lock:                      # the consumer sends from both of its threads
            self.pg.send([header], self.peer, 0).wait(wait)
            self.pg.send([data], self.peer, 0).wait(wait)
        if kv is not None:
            cached = self.replies.get(timeout=self.timeout)[1]
            kv = kv[:, :, cached:].contiguous()
            self.kv_pg.send([kv], self.peer, 1).wait(wait)
            self.cached_tokens += cached
            self.bytes_sent += kv.numel() * kv.element_size()

    def _receive_loop(self) -> None:
        if self.kv_device.type == "cuda":
            torch.cuda.set_device(self.kv_device)        # the current device is per thread
        try:
            while True:
                header = torch.empty(3, dtype=torch.int64)
                self.pg.recv([header], self.peer, 0).wait()
                kind, num_bytes, num_kv = header.tolist()
                data = torch.empty(num_bytes, dtype=torch.uint8)
                self.pg.recv([data], self.peer, 0).wait()
                payload = pickle.loads(data.numpy().tobytes())
                kv = None
                if num_kv:
                    t0 = time.perf_counter()
                    shape = list(payload["kv_shape"])
                    payload["cached"] = self._cached_tokens(payload["prompt_token_ids"])
                    self.send(HAVE, payload["cached"])
                    shape[2] -= payload["cached"]
                    kv = torch.empty(shape, dtype=self.engine.dtype, device=self.kv_device)
                    self.kv_pg.recv([kv], self.peer, 1).wait()
                    self.transfer_seconds += time.perf_counter() - t0
                    self.bytes_received += kv.numel() * kv.element_size()
                    self.num_received += 1
                (self.replies if kind == HAVE else self.inbox).put((kind, payload, kv))
                if kind in (SHUTDOWN, BYE):
                    return
        except Exception as e:  # noqa: BLE001 (the peer died: tell the main loop)
            self.inbox.put((ERROR, f"connection to the {self.peer_role} lost: {e}", None))

    def poll(self, timeout: float = 0.0) -> list[tuple]:
        """Messages received so far; waits up to `timeout` s for the first one."""
        try:
            got = [self.inbox.get(timeout=timeout) if timeout else self.inbox.get_nowait()]
        except queue.Empty:
            return []
        while not self.inbox.empty():
            got.append(self.inbox.get_nowait())
        return got

    # ------------------------------------------------------------------ KV in, KV out
    def send_kv(self, seq) -> None:
        """Producer: send seq's first token (with its logprobs, if asked for), its sampler's
        generator and its prompt's K/V (the P prompt tokens, every layer, less those the
        consumer's prefix cache holds)."""
        t0 = time.perf_counter()
        runner = self.engine.runner
        n = seq.num_prompt_tokens
        generator_state = runner.sampler.get_generator_state(seq)
        blocks = runner.kv_cache[:, :, seq.block_table]          # (L, 2, nb, bs, kvh, hd)
        kv = blocks.flatten(2, 3)[:, :, :n].to(self.kv_device)    # (L, 2, P, kvh, hd)
        self.send(KV, {"request_id": seq.request_id, "prompt_token_ids": seq.prompt_token_ids,
                       "params": seq.params, "first_token": seq.token_ids[n],
                       "first_logprobs": seq.output_logprobs[0] if seq.output_logprobs
                       else None, "kv_shape": tuple(kv.shape),
                       "generator": generator_state}, kv)
        self.num_sent += 1
        self.transfer_seconds += time.perf_counter() - t0

    def _cached_tokens(self, prompt_token_ids: list[int]) -> int:
        """Consumer, receiving thread: prompt tokens its prefix cache holds now (evicted before
        admission: refused, see kv_loader). A block evicted mid-read: send the whole prompt."""
        seq = SequenceGroup("probe", None, prompt_token_ids, SamplingParams(), -1).seqs[0]
        try:
            return self.engine.block_manager.num_cached_tokens(seq)
        except KeyError:
            return 0

    def kv_loader(self, meta: dict, kv: torch.Tensor):
        """Consumer: load_kv(seq) for add_prefilled_request: write the received K/V into seq's
        new blocks (those the prefix cache holds are computed: left as they are) and take
        over the producer's generator."""
        def load_kv(seq) -> None:
            runner = self.engine.runner
            bs = self.engine.runner.block_size
            cached = meta["cached"]
            start = seq.num_computed_tokens
            if start < cached:                   # evicted since HAVE: the producer redoes it
                self.engine.block_manager.free(seq)
                raise ValueError(f"{cached - start} cached prompt tokens were evicted")
            slots = [seq.block_table[p // bs] * bs + p % bs
                     for p in range(start, len(meta["prompt_token_ids"]))]
            pool = runner.kv_cache.flatten(2, 3)                 # (L, 2, blocks x bs, kvh, hd)
            pool[:, :, torch.tensor(slots, device=pool.device, dtype=torch.long)] = \
                kv[:, :, start - cached:].to(pool.device)
            if meta["generator"] is not None:
                runner.sampler.set_generator_state(seq, meta["generator"])
        return load_kv


def serve_decode(engine) -> dict:
    """The consumer's loop: admit transferred requests when their blocks fit, decode, stream
    outputs back, until the producer says stop (or is gone). Returns the final report."""
    conn = engine.kv_connector
    pending = deque()
    error = None
    # A prefill here would be a bug; the largest step a decode waited through is the
    # interference measure lesson 08 compares with colocated and chunked prefill.
    counts = {"num_steps": 0, "num_prefill_steps": 0, "largest_decode_step_tokens": 0}
    while True:
        msgs = conn.poll(0 if engine.has_unfinished_requests() or pending else 0.01)
        if any(kind in (SHUTDOWN, ERROR) for kind, _, _ in msgs):
            error = next((p for k, p, _ in msgs if k == ERROR), None)
            break
        for kind, payload, kv in msgs:
            if kind == KV:
                pending.append((payload, kv))
            elif kind == ABORT:
                pending = deque(m for m in pending if m[0]["request_id"] != payload)
                engine.abort_request(payload)
            elif kind == REPORT:
                conn.send(REPORT, _report(engine, counts, None))
        while pending:                          # first come, first served, as in `waiting`
            meta, kv = pending[0]
            try:
                if not engine.add_prefilled_request(
                        meta["request_id"], meta["prompt_token_ids"], meta["params"],
                        meta["first_token"], conn.kv_loader(meta, kv), meta["first_logprobs"]):
                    break
            except ValueError as e:             # it can never run here: the producer keeps it
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
    report = _report(engine, counts, error)
    if error is None:
        conn.send(BYE, report)
    return report


def _report(engine, counts: dict, error: str | None) -> dict:
    """The consumer's counters: bytes in, steps (and those that prefilled), its pool."""
    conn = engine.kv_connector
    bm = engine.block_manager
    return {"bytes_received": conn.bytes_received, "num_received": conn.num_received,
            "receive_seconds": conn.transfer_seconds, **counts,
            "num_blocks": bm.num_blocks, "num_free_blocks": bm.num_free_blocks,
            "num_referenced_blocks": sum(c > 0 for c in bm.ref_counts),
            "stats": dataclasses.asdict(engine.stats()), "error": error}
