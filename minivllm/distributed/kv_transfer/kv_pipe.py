"""The KV connector's transport: two engines' processes over torch.distributed point-to-point
(vLLM twins: V0's vllm/distributed/kv_transfer/kv_pipe/torch_distributed_pipe.py and
kv_lookup_buffer/simple_buffer.py; the process's one pipe, as kv_transfer_state.py keeps its
connector).

    producer (kv_role "kv_producer", rank 0)          consumer (kv_role "kv_consumer", rank 1)
      worker side: send(KV, request, prompt K/V)  ->    receiving thread: HAVE (cached tokens),
                                                          the K/V kept in `received` until the
                                                          worker side loads it into blocks
      front: ABORT, REPORT, SHUTDOWN              <->   front: OUTPUTS, REJECT, REPORT, BYE

One message: a header (kind, payload bytes, K/V follows), a pickled payload, then a prompt's K/V
as one (layers, 2, tokens, kv_heads, head_dim) tensor, sent once the consumer's receiving
thread has answered how many leading prompt tokens its prefix cache holds (HAVE: a round trip,
not a decode step; the consumer's scheduler side answers, `lookup_cached_tokens`):
(P - cached) x kv_bytes_per_token bytes, counted both sides. Each role receives on a thread of
its own (gloo's irecv makes no progress unless waited on), so a transfer lands while the
consumer decodes; every wait has a timeout. KV between two GPUs goes over NCCL; anything else
(CPUs, or both roles on one GPU, which NCCL refuses) over gloo, through host memory.

A bad pairing (same role twice, no peer, different model, weights, dtype or block_size) is
refused when the engines start, on both sides, naming the difference.

The pipe holds no engine: the worker side (kv_connector.py) makes it with what the handshake
compares, and sends and takes K/V through it; the front (DisaggLLM, the consumer's loop in
minivllm/engine/disagg/) sends and polls the other messages.
"""

from __future__ import annotations

import json
import pickle
import queue
import socket
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

KV, OUTPUTS, REJECT, ABORT, SHUTDOWN, BYE, ERROR, REPORT, HAVE = range(9)   # message kinds

_PIPE: TorchDistributedPipe | None = None     # this process's (one engine pair per process)


def get_kv_pipe() -> TorchDistributedPipe | None:
    """The pipe the last engine made with a kv_transfer_config built (vLLM's
    get_kv_transfer_group); None if none did."""
    return _PIPE


class TorchDistributedPipe:
    """One role's end of the connection. info: what the handshake compares (model, weights,
    dtype, block_size); device: the engine's."""

    def __init__(self, cfg, info: dict, device: torch.device, dtype: torch.dtype):
        global _PIPE
        self.role = cfg.kv_role
        self.rank = cfg.rank
        self.peer = 1 - cfg.rank
        self.peer_role = ("kv_producer", "kv_consumer")[self.peer]
        self.timeout = cfg.timeout
        self.where = f"{socket.gethostname()}/{device}"
        self.dtype = dtype
        self.bytes_sent = self.bytes_received = self.num_sent = self.num_received = 0
        self.cached_tokens = 0                    # prompt tokens not sent: the consumer had them
        self.transfer_seconds = 0.0               # producer: gather + send; consumer: receive
        # Consumer: prompt tokens its prefix cache holds (its scheduler side sets this).
        self.lookup_cached_tokens = lambda prompt_token_ids: 0
        self.received: dict[str, tuple] = {}    # consumer: request id -> (K/V, generator)
        self.sent: set[str] = set()               # producer: requests whose K/V went
        self.broken = False                       # producer: a send failed, send no more K/V
        store, peer = self._rendezvous(cfg, info)
        self.pg = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), self.rank, 2,
                                        timedelta(days=7))     # idle receives wait for long
        # KV between two GPUs goes over NCCL; anything else (CPUs, or both roles on one GPU,
        # which NCCL refuses) over gloo, through host memory.
        self.kv_pg = self.pg
        self.kv_device = torch.device("cpu")
        if "/cuda" in self.where and "/cuda" in peer["where"] and self.where != peer["where"]:
            torch.cuda.set_device(device)
            self.kv_pg = dist.ProcessGroupNCCL(dist.PrefixStore("nccl", store), self.rank, 2)
            self.kv_device = device
        self.inbox = queue.Queue()
        self.replies = queue.Queue()
        self.lock = threading.Lock()
        self.receiver = threading.Thread(target=self._receive_loop, daemon=True, name="kv-recv")
        self.receiver.start()
        _PIPE = self

    def _rendezvous(self, cfg, info: dict) -> tuple[dist.TCPStore, dict]:
        """Meet the other role at kv_ip:kv_port and check that the two engines agree."""
        addr = f"{cfg.kv_ip}:{cfg.kv_port}"
        try:
            store = dist.TCPStore(cfg.kv_ip, cfg.kv_port, 2, is_master=self.rank == 0,
                                  timeout=timedelta(seconds=self.timeout), wait_for_workers=False)
        except Exception as e:  # noqa: BLE001 (a taken port, an unreachable host)
            raise RuntimeError(f"{self.role}: cannot {'listen on' if self.rank == 0 else 'reach'}"
                               f" {addr} (is another {self.role} there?): {e}") from None
        mine = {"role": self.role, **info, "where": self.where}
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
                if num_kv:
                    t0 = time.perf_counter()
                    shape = list(payload["kv_shape"])
                    payload["cached"] = self._cached_tokens(payload["prompt_token_ids"])
                    self.send(HAVE, payload["cached"])
                    shape[2] -= payload["cached"]
                    kv = torch.empty(shape, dtype=self.dtype, device=self.kv_device)
                    self.kv_pg.recv([kv], self.peer, 1).wait()
                    self.transfer_seconds += time.perf_counter() - t0
                    self.bytes_received += kv.numel() * kv.element_size()
                    self.num_received += 1
                    # The K/V waits here for its blocks; the front gets the request.
                    self.received[payload["request_id"]] = (kv, payload.pop("generator"))
                (self.replies if kind == HAVE else self.inbox).put((kind, payload, None))
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

    def _cached_tokens(self, prompt_token_ids: list[int]) -> int:
        """Consumer, receiving thread: prompt tokens its prefix cache holds now (evicted before
        the blocks are taken: refused there). A block evicted mid-read: send the whole prompt."""
        try:
            return self.lookup_cached_tokens(prompt_token_ids)
        except KeyError:
            return 0
