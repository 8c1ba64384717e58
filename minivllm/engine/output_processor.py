"""Tokens out (vLLM twin: vllm/v1/engine/output_processor.py, OutputProcessor): detokenize
each new token, decide whether its sequence is done (stop token, stop string, length), and
build the RequestOutput a caller sees.

Left out, compared with vLLM: per-request output queues for streaming (the AsyncLLMEngine
keeps its own), and the delta / final-only output kinds.
"""

from __future__ import annotations

from minivllm.engine.detokenizer import find_stop_string
from minivllm.outputs import CompletionOutput, RequestMetrics, RequestOutput
from minivllm.core.sequence import Sequence, SequenceGroup, SequenceStatus


def check_stop(seq: Sequence, eos_token_ids: set[int], max_model_len: int
               ) -> SequenceStatus | None:
    """Detokenize seq's newest token, then decide whether seq is done."""
    params, token = seq.params, seq.token_ids[-1]
    stop_token = token in params.stop_token_ids or (not params.ignore_eos
                                                    and token in eos_token_ids)
    length = seq.num_output_tokens >= params.max_tokens or len(seq) >= max_model_len
    new_text = seq.detokenizer.update(seq.token_ids, final=stop_token or length)
    seq.output_text = seq.detokenizer.text
    if stop_token:
        return SequenceStatus.FINISHED_STOPPED
    hit = params.stop and new_text and find_stop_string(
        seq.output_text, new_text, params.stop, params.include_stop_str_in_output)
    if hit:
        seq.output_text, seq.stop_string = hit
        return SequenceStatus.FINISHED_STOPPED
    if length:
        return SequenceStatus.FINISHED_LENGTH
    return None


def request_output(group: SequenceGroup) -> RequestOutput:
    seqs = group.seqs
    outputs = [CompletionOutput(
        index=seq.index, text=seq.output_text, token_ids=seq.output_token_ids,
        logprobs=seq.output_logprobs if seq.params.logprobs is not None else None,
        finish_reason=seq.status.value if seq.is_finished else None) for seq in seqs]
    first = seqs[0].metrics
    finished = group.is_finished or group.error is not None
    metrics = RequestMetrics(
        arrival_time=group.arrival_time,
        first_scheduled_time=first.first_scheduled_time,
        first_token_time=first.first_token_time,
        finished_time=max(s.metrics.finished_time or 0 for s in seqs) if finished else None,
        num_draft_tokens=sum(s.metrics.num_draft_tokens for s in seqs),
        num_accepted_tokens=sum(s.metrics.num_accepted_tokens for s in seqs))
    times = first.token_times
    return RequestOutput(
        request_id=group.request_id, prompt=group.prompt,
        prompt_token_ids=group.prompt_token_ids, outputs=outputs, finished=finished,
        metrics=metrics,       # gaps listed once, at the end: not O(length) every step
        inter_token_latencies=[b - a for a, b in zip(times, times[1:])] if finished else [],
        error=group.error)
