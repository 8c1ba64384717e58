"""Tokens out (vLLM twin: vllm/v1/engine/output_processor.py): detokenize each new token, find
stop strings, and build the RequestOutput a caller sees. Stop tokens and lengths were checked by
the scheduler (Scheduler.update_from_output) when the tokens were appended; a stop string needs
the text, so it is found here, and the engine then finishes the sequence through the scheduler.

Left out, compared with vLLM: running in a separate process from the engine core, per-request
output queues for streaming (the AsyncLLMEngine keeps its own), and the delta / final-only
output kinds.
"""

from __future__ import annotations

from minivllm.engine.detokenizer import IncrementalDetokenizer, find_stop_string
from minivllm.outputs import CompletionOutput, RequestMetrics, RequestOutput
from minivllm.core.sequence import Sequence, SequenceGroup, SequenceStatus


class OutputProcessor:
    """Text for every sequence that got tokens this step, and the stop strings found in it."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def detokenize(self, seq: Sequence) -> bool:
        """Detokenize seq's tokens appended since the last call, one at a time; True when a
        stop string ended it: its text is cut there and any later token of the same step (a
        speculative step appends several) is dropped."""
        det = seq.detokenizer
        if det is None:
            det = seq.detokenizer = IncrementalDetokenizer(
                self.tokenizer, seq.params.skip_special_tokens, start=seq.num_prompt_tokens)
        params = seq.params
        end = len(seq)
        for n in range(det.num_tokens + 1, end + 1):
            # The token that ended a sequence (stop token, length) flushes held-back text.
            final = n == end and seq.is_finished
            # Only a speculative step (several new tokens) needs a prefix: no copy per decode.
            tokens = seq.token_ids if n == end else seq.token_ids[:n]
            new_text = det.update(tokens, final=final)
            seq.output_text = det.text
            if final and seq.status is SequenceStatus.FINISHED_STOPPED:
                return False                 # a stop token: its text ends no stop string
            hit = params.stop and new_text and find_stop_string(
                seq.output_text, new_text, params.stop, params.include_stop_str_in_output)
            if hit:
                seq.output_text, seq.stop_string = hit
                seq.truncate(n)
                return True
        return False


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
