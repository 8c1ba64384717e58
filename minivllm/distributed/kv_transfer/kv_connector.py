"""Prefill/decode disaggregation: prefill on one engine, decode on another, KV sent between
(vLLM twin: vllm/distributed/kv_transfer/kv_connector/v1/base.py, KVConnectorBase_V1).

A prefill is compute-bound (hundreds of tokens share every weight read) and a decode step is
memory-bound (one token per sequence); in one engine a long prefill stalls every running decode
for its whole step. Split them (DistServe, Splitwise; vLLM's KV connectors):

    front (DisaggLLM, in the producer's process: minivllm/engine/disagg/)
      add_request ->  producer engine (kv_role "kv_producer", rank 0): prefill, first token;
                        its worker side sends the prompt's K/V, every layer, only its P tokens
                        | (kv_pipe.py: gloo on CPU, NCCL for GPU tensors)
                        v
                      consumer engine (kv_role "kv_consumer", rank 1): add_prefilled_request
                        takes blocks in its own pool, its worker side writes the K/V there,
                        it decodes on
      RequestOutput <- the consumer's outputs, every step, over the same connection

As in vLLM V1, the connector has two sides that share nothing but the metadata a
SchedulerOutput carries (`kv_connector_metadata`), and neither holds the engine:

    KVConnectorScheduler  in the core, beside the Scheduler: which blocks of which request
                          move. Consumer: update_state_after_alloc (the blocks a transferred
                          request got; the prefix cache's hits are left as they are).
                          Producer: a request asked to decode elsewhere
                          (kv_transfer_params={"do_remote_decode": True}) whose prompt is
                          done this step. build_connector_meta puts both in the step's
                          KVConnectorMetadata: block ids and token counts.
    KVConnectorWorker     in the Worker, around the runner's execute_model: start_load_kv
                          writes received K/V into the runner's KV cache before the forward;
                          wait_for_save sends a prompt's K/V, its first token and its sampler's
                          generator once the step has sampled it (a seeded request draws on
                          the consumer what it would in one engine).

Failures: a consumer that refuses a request (it can never fit its pool) or dies (its connection
closes, its process is gone, or it is silent for `timeout` seconds with requests in flight)
loses nothing: the front prefills those requests again on the producer, whose prefix cache
usually still holds the prompt, and decodes them there (their outputs restart from the first
token; greedy outputs are unchanged). A request whose KV could not be sent just keeps decoding
on the producer.

Left out, compared with vLLM: layer-by-layer sending during the forward (save_kv_layer) and
loading (wait_for_layer_load), asynchronous loads (get_num_new_matched_tokens' load_async: a
transfer here has landed before its request is admitted), NIXL / RDMA and Mooncake transports,
many producers and consumers behind a routing proxy (one front owns the pair here: DisaggLLM,
which `minivllm serve --kv-transfer-config` serves), TP ranks. vLLM's decode side computes the
prompt's last token again to sample; here the first token travels with the K/V.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import torch

from minivllm.core.request import Request
from minivllm.distributed.kv_transfer.kv_pipe import KV, ERROR, TorchDistributedPipe, get_kv_pipe
from minivllm.sampling_params import SamplingParams



@dataclass(slots=True)
class ReqMeta:
    """One request's K/V to move (vLLM's ReqMeta); its generator goes with it, by request id."""

    request_id: str
    sampling_params: SamplingParams
    block_ids: list[int]
    num_tokens: int                 # the prompt's
    start: int = 0                  # load: tokens held here already (prefix cache): left as is
    cached: int = 0                 # load: tokens the producer did not send (held here then)
    prompt_token_ids: list[int] = field(default_factory=list)    # save: the consumer's key


@dataclass(slots=True)
class KVConnectorMetadata:
    """What the scheduler side tells the worker side for one step."""

    loads: list[ReqMeta] = field(default_factory=list)     # consumer: K/V into these blocks
    saves: list[ReqMeta] = field(default_factory=list)     # producer: K/V of these blocks out


class KVConnectorScheduler:
    """The scheduler's side (KVConnectorBase_V1 with KVConnectorRole.SCHEDULER): block ids and
    token counts, no tensor. num_cached_tokens(seq): the prefix cache's answer, for HAVE."""

    def __init__(self, kv_role: str, num_cached_tokens=None):
        self.kv_role = kv_role
        self.loads: list[ReqMeta] = []
        pipe = get_kv_pipe()
        if kv_role == "kv_consumer" and pipe is not None and num_cached_tokens is not None:
            pipe.lookup_cached_tokens = lambda prompt_token_ids: num_cached_tokens(
                Request("probe", prompt_token_ids, SamplingParams()))

    def update_state_after_alloc(self, seq) -> None:
        """Consumer: seq, a transferred request, just got its blocks; its prompt's K/V goes
        into those the prefix cache did not hold. ValueError if the prefix cache lost tokens
        the producer did not send (evicted since HAVE): the producer prefills it again. The
        scheduler asks this of every request it admits: one that was not transferred, or was
        and comes back after a preemption (it has its first token by then, and is computed
        again like any other), has nothing to load."""
        if "cached" not in (seq.kv_transfer_params or {}) or seq.num_output_tokens:
            return
        cached = seq.kv_transfer_params["cached"]
        start = seq.num_computed_tokens
        if start < cached:
            raise ValueError(f"{cached - start} cached prompt tokens were evicted")
        self.loads.append(ReqMeta(seq.request_id, seq.sampling_params, list(seq.block_table),
                                  seq.num_prompt_tokens, start, cached))

    def build_connector_meta(self, scheduler_output, requests: dict) -> KVConnectorMetadata | None:
        """The step's loads (every one pending: the blocks' K/V is there before any forward
        reads them, even if the request was aborted or preempted since) and saves (the
        requests asked to decode elsewhere that sample their first token this step)."""
        scheduled = [requests[s.request_id] for s in scheduler_output.scheduled if s.samples]
        saves = [ReqMeta(s.request_id, s.sampling_params, list(s.block_table), s.num_prompt_tokens,
                         prompt_token_ids=s.prompt_token_ids)
                 for s in scheduled if not s.num_output_tokens
                 and (s.kv_transfer_params or {}).get("do_remote_decode")]
        if not (self.loads or saves):
            return None
        meta = KVConnectorMetadata(self.loads, saves)
        self.loads = []
        return meta


class KVConnectorWorker:
    """The worker's side (KVConnectorBase_V1 with KVConnectorRole.WORKER): the transfers,
    into and out of the runner's KV cache, as the metadata says. It makes the process's pipe
    (kv_pipe.py), which meets the other role, or refuses it: the two must share the model,
    its weights (a checksum of the first embedding rows), dtype and block_size."""

    def __init__(self, vllm_config, runner):
        info = {"model": dataclasses.asdict(vllm_config.model_config.hf_config),
                "weights": runner.model.model.embed_tokens.weight[:64].double().sum().item(),
                "dtype": str(runner.dtype), "block_size": vllm_config.cache_config.block_size}
        self.pipe = TorchDistributedPipe(vllm_config.kv_transfer_config, info,
                                         runner.device, runner.dtype)

    def start_load_kv(self, meta: KVConnectorMetadata, kv_cache: torch.Tensor,
                      sampler) -> None:
        """Consumer, before the forward: each received prompt's K/V into its new blocks, and
        the producer's generator taken over."""
        bs = kv_cache.shape[3]                                  # (L, 2, blocks, bs, kvh, hd)
        pool = kv_cache.flatten(2, 3)                           # (L, 2, blocks x bs, kvh, hd)
        for req in meta.loads:
            kv, generator = self.pipe.received.pop(req.request_id)
            slots = [req.block_ids[p // bs] * bs + p % bs for p in range(req.start, req.num_tokens)]
            pool[:, :, torch.tensor(slots, device=pool.device, dtype=torch.long)] = \
                kv[:, :, req.start - req.cached:].to(pool.device)
            if generator is not None:
                sampler.set_generator_state(req.request_id, generator)

    def wait_for_save(self, meta: KVConnectorMetadata, kv_cache: torch.Tensor, sampler,
                      output) -> None:
        """Producer, after sampling: each prompt's K/V (the P prompt tokens, every layer, less
        those the consumer's prefix cache holds), its first token (with its logprobs, if asked
        for) and its generator, sent. A failed send leaves the request here: the front learns
        of it from ERROR and decodes it here (`pipe.sent` lists the requests that went)."""
        pipe = self.pipe
        for req in meta.saves:
            draws = output.sampled.get(req.request_id)
            if not draws or pipe.broken:            # it failed, or the consumer is gone
                continue
            t0 = time.perf_counter()
            blocks = kv_cache[:, :, req.block_ids]                 # (L, 2, nb, bs, kvh, hd)
            kv = blocks.flatten(2, 3)[:, :, :req.num_tokens].to(pipe.kv_device)  # (L, 2, P, ..)
            try:
                pipe.send(KV, {"request_id": req.request_id,
                               "prompt_token_ids": req.prompt_token_ids,
                               "params": req.sampling_params,
                               "first_token": draws[0][0], "first_logprobs": draws[0][1],
                               "kv_shape": tuple(kv.shape),
                               "generator": sampler.get_generator_state(req.request_id)}, kv)
            except Exception as e:  # noqa: BLE001 (it keeps decoding here)
                pipe.broken = True
                pipe.inbox.put((ERROR, f"sending {req.request_id}'s KV failed: {e}", None))
                continue
            pipe.sent.add(req.request_id)
            pipe.num_sent += 1
            pipe.transfer_seconds += time.perf_counter() - t0

