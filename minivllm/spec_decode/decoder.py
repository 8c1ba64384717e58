"""SpeculativeDecoder: the model runner's drafter, which proposes the drafts (vLLM twin: the
drafter of vllm/v1/worker/gpu_model_runner.py and its propose_draft_token_ids).

A decode step reads every weight of the model to produce one token per sequence; on a CPU or a
GPU at small batch that read, not the arithmetic, sets the time. So running k + 1 tokens of
one sequence through the model costs little more than running 1, and if k of them were good
guesses, one forward yields up to k + 1 tokens:

    step t      tokens ... a b c        proposer: "d e f" (k = 3 drafts)
    verify      forward over [c d e f]  -> target logits at 4 positions: after c, d, e and f
    accept      d == target's pick after c?  yes.  e after d?  no: the target says x
    result      append d x              2 tokens from 1 forward; f is thrown away, and the KV
                                        slots of e and f are rolled back (num_computed_tokens)

Nothing is approximate (the acceptance rule: minivllm/sample/rejection_sampler.py).

Proposers:
    ngram   prompt lookup: propose the k tokens that followed the last n tokens earlier in
            the sequence (minivllm/spec_decode/ngram_proposer.py). No model at all.
    draft_model  a smaller model with the same vocabulary guesses greedily over its own paged
            KV cache (minivllm/spec_decode/draft_model.py).

In the engine, four seams (listed in minivllm/spec_decode/__init__.py): the model runner owns
this drafter and, right after sampling, calls `propose` on its own state of each sample (the
tokens it had, plus the ones just sampled), as vLLM V1's runner does; the drafts ride back in
the ModelRunnerOutput, and EngineCore.step hands them to Scheduler.update_draft_token_ids for
the next step. The scheduler fits them into that step's token budget and reserves their
lookahead slots; the model runner verifies them (k + 1 logits rows, the rejection sampler);
Scheduler.update_from_output appends what was accepted and rolls the rejected slots back. A
sequence without drafts (prefilling, or nothing found) takes a plain one-token step in the
same batch. The core never sees a proposer, and a proposer is never handed a core object.

The drafter lives on the rank that samples (under tensor parallelism rank 0, whose output the
core reads; the other ranks neither sample nor draft). A proposer with state (the draft
model's twin of each request) keeps it while the runner keeps its own: `free(req_ids)` drops
it when the runner forgets finished requests (SchedulerOutput.finished_req_ids).

Left out, compared with vLLM: the EAGLE, Medusa and MTP proposers, tree attention over several
candidate continuations. (A request another engine prefilled, EngineCore.add_prefilled_request,
takes its first decode step without drafts: the runner has not seen it sample.)
"""

from __future__ import annotations

import dataclasses

from minivllm.config import SpeculativeConfig, VllmConfig
from minivllm.outputs import ModelRunnerOutput
from minivllm.spec_decode.ngram_proposer import NgramProposer


def make_drafter(vllm_config: VllmConfig, runner, worker_class) -> SpeculativeDecoder | None:
    """The drafter of `runner` (the target's ModelRunner, its pool allocated) for
    vllm_config; None without speculative_config. A draft model gets a Worker of its own
    (worker_class, passed in) on the target's device, its pool as many blocks as the target's,
    so that it always fits what it must hold."""
    spec = vllm_config.speculative_config
    if spec is None:
        return None
    if spec.method == "draft_model":
        from minivllm.spec_decode.draft_model import DraftModelProposer, draft_model_config
        path, hf_config = draft_model_config(spec.model, runner.hf_config.vocab_size)
        vc = vllm_config
        draft_config = dataclasses.replace(
            vc, speculative_config=None,
            model_config=dataclasses.replace(vc.model_config, hf_config=hf_config,
                                             model=str(path), quantization=spec.quantization),
            cache_config=dataclasses.replace(vc.cache_config, enable_prefix_caching=False,
                                             num_kv_blocks=runner.num_blocks),
            scheduler_config=dataclasses.replace(vc.scheduler_config,
                                                 preemption_mode="recompute"))
        worker = worker_class(draft_config, device=runner.device)
        worker.load_model()
        worker.initialize_cache(draft_config)
        proposer = DraftModelProposer(worker.model_runner)
    else:
        proposer = NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max)
    return SpeculativeDecoder(spec, vllm_config.model_config.max_model_len, proposer)


class SpeculativeDecoder:
    """Seam 1 of speculative decoding: after each step's sampling, draft tokens for every
    sample that sampled and has room for them, from the runner's own state."""

    def __init__(self, config: SpeculativeConfig, max_model_len: int, proposer):
        """proposer: NgramProposer, or DraftModelProposer over the draft's own runner
        (make_drafter builds them)."""
        self.config = config
        self.max_model_len = max_model_len
        self.proposer = proposer

    def propose(self, states: list, output: ModelRunnerOutput) -> dict[str, list[int]]:
        """Draft tokens for the next step of each request that sampled this step, by request
        id (for the scheduler's update_draft_token_ids). states: the runner's
        CachedRequestStates of the requests that sampled, their tokens as the step began;
        output: what each appends now (`sampled`). At most k drafts, and no more than the
        request may still produce (max_tokens, max_model_len) minus the one token the target
        always adds. A request that this step stops gets drafts the scheduler ignores."""
        req_ids = []
        token_ids = []
        rooms = []
        for state in states:
            draws = output.sampled.get(state.req_id)
            if not draws:
                continue
            tokens = state.token_ids + [token for token, _ in draws]
            num_output = len(tokens) - state.num_prompt_tokens
            room = min(self.config.num_speculative_tokens,
                       state.sampling_params.max_tokens - num_output - 1,
                       self.max_model_len - len(tokens) - 1)
            if room > 0:
                req_ids.append(state.req_id)
                token_ids.append(tokens)
                rooms.append(room)
        drafts = self.proposer.propose_batch(req_ids, token_ids, rooms)
        return {req_id: d for req_id, d in zip(req_ids, drafts) if d}

    def free(self, req_ids) -> None:
        """These requests have finished: the proposer forgets them (the draft model's twins)."""
        self.proposer.free(req_ids)
