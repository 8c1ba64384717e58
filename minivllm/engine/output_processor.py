"""Tokens out, on the front end's side (vLLM twin: vllm/v1/engine/output_processor.py): the
OutputProcessor keeps its own state of every request it was given (RequestState: the tokens so
far, the text, logprobs, times), grows it from each step's EngineCoreOutputs, finds stop strings,
and builds the RequestOutput a caller sees. It never reads an engine-core object.

Stop tokens and lengths were checked by the scheduler when the tokens were appended; a stop
string needs the text, so it is found here: the sample's tokens and text are cut at it, and the
front end then finishes that core request (EngineCore.finish_requests), as vLLM V1 aborts a
request whose text has stopped.

A request with n > 1 samples reaches the core as n child requests of one sample each (vLLM
V1's fan-out, engine/parallel_sampling.py): the OutputProcessor keeps ONE RequestState for the
parent, routes child i's tokens to its sample i, and so gathers the children into one
RequestOutput with n CompletionOutputs, streaming and final. (A V0 core that forks the samples
itself names them with the same child ids, core/v0/, and they land in the same place.)

Left out, compared with vLLM: per-request output queues for streaming (the AsyncLLMEngine keeps
its own), and the delta / final-only output kinds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from minivllm.engine.detokenizer import IncrementalDetokenizer, find_stop_string
from minivllm.engine.parallel_sampling import ParentRequest
from minivllm.outputs import (CompletionOutput, EngineCoreOutput, EngineCoreOutputs,
                              RequestMetrics, RequestOutput)
from minivllm.sampling_params import SamplingParams


@dataclass(slots=True)
class SampleState:
    """One sample of a request, as the front end knows it."""

    index: int
    token_ids: list[int]                      # prompt + output so far (the detokenizer's input)
    detokenizer: IncrementalDetokenizer
    text: str = ""
    logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_string: str | None = None            # the stop string that finished it, if any
    token_times: list[float] = field(default_factory=list)   # when each output token came
    finished_time: float | None = None
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


@dataclass(slots=True)
class RequestState:
    """A request the front end is waiting on (vLLM's RequestState)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    samples: dict[int, SampleState] = field(default_factory=dict)
    first_scheduled_time: float | None = None
    num_cached_tokens: int = 0                # its prompt's tokens a KV tier held (vLLM's)
    error: str | None = None
    parent: ParentRequest | None = None       # n > 1: fanned out into the parent's children

    @property
    def finished(self) -> bool:
        return self.error is not None or (len(self.samples) == self.params.n and all(
            s.finish_reason is not None for s in self.samples.values()))

    @property
    def core_request_ids(self) -> list[str]:
        """The core's requests that make this one: a fanned-out parent's children (child i is
        sample i), else the request itself (all its samples, if the core forks them)."""
        return self.parent.child_request_ids if self.parent else [self.request_id]


@dataclass(slots=True)
class OutputProcessorOutput:
    request_outputs: list[RequestOutput]
    stopped: list[str]     # the core's request ids whose text hit a stop string
    errors: dict[str, str]           # request id -> why its output processing failed
    # The core's request ids to abort, with the error: a request whose output processing
    # failed, or a failed parent's children still running (one child's fault fails them all).
    to_abort: dict[str, str] = field(default_factory=dict)


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.request_states: dict[str, RequestState] = {}      # by the caller's request id
        # A fanned-out child's request id -> (its parent's state, the sample it is).
        self.child_requests: dict[str, tuple[RequestState, int]] = {}

    def in_use(self, request_id: str) -> bool:
        return request_id in self.request_states or request_id in self.child_requests

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams, arrival_time: float | None = None,
                    parent: ParentRequest | None = None) -> RequestState:
        """parent: the request was fanned out into its children (n > 1)."""
        state = RequestState(request_id, prompt, list(prompt_token_ids), params,
                             time.perf_counter() if arrival_time is None else arrival_time,
                             parent=parent)
        self.request_states[request_id] = state
        for index, child in enumerate(parent.child_request_ids if parent else ()):
            self.child_requests[child] = (state, index)
        return state

    def abort_requests(self, request_ids) -> list[str]:
        """Forget these requests; returns the core's request ids to abort: a parent's every
        child (a child's id stands for its parent), an id not known here as it is."""
        core_ids = []
        for request_id in request_ids:
            if request_id in self.child_requests:
                request_id = self.child_requests[request_id][0].request_id
            state = self.request_states.get(request_id)
            if state is None:
                core_ids.append(request_id)
                continue
            self._remove(state)
            core_ids += state.core_request_ids
        return list(dict.fromkeys(core_ids))

    def _remove(self, state: RequestState) -> None:
        del self.request_states[state.request_id]
        for child in state.parent.child_request_ids if state.parent else ():
            del self.child_requests[child]

    def has_unfinished_requests(self) -> bool:
        return bool(self.request_states)

    # --8<-- [start:process_outputs]
    def process_outputs(self, core_outputs: EngineCoreOutputs) -> OutputProcessorOutput:
        """Apply one step's EngineCoreOutputs: a RequestOutput for every request that moved
        (finished ones leave), the samples a stop string ended, and the requests whose output
        processing failed (each fails alone)."""
        touched: dict[str, RequestState] = {}
        stopped = []
        errors = {}
        for out in core_outputs.outputs:
            # A fanned-out child's tokens are sample `index` of its parent.
            state, index = self.child_requests.get(out.request_id) or (
                self.request_states.get(out.request_id), 0)
            if state is None or state.request_id in errors:
                continue
            sample = state.samples.get(index)
            if sample is not None and sample.finish_reason is not None:
                continue        # stopped here, and the core (another process) ran on a step
            touched[state.request_id] = state
            try:
                if self._update(state, out, index, core_outputs.timestamp):
                    stopped.append(out.request_id)
            except Exception as e:                   # noqa: BLE001 (this request alone)
                errors[state.request_id] = state.error = f"output processing failed: {e!r}"
        outputs = [request_output(state) for state in touched.values()]
        to_abort = {}
        for state in [state for state in touched.values() if state.finished]:
            self._remove(state)
            if state.error is not None:   # what of it still runs in the core goes too
                to_abort.update(dict.fromkeys(state.core_request_ids, state.error))
        return OutputProcessorOutput(outputs, stopped, errors, to_abort)
    # --8<-- [end:process_outputs]

    def _update(self, state: RequestState, out: EngineCoreOutput, index: int,
                now: float) -> bool:
        """Grow sample `index` by its new tokens; True when a stop string ended it."""
        sample = state.samples.get(index)
        if sample is None:
            sample = state.samples[index] = SampleState(
                index, list(state.prompt_token_ids), IncrementalDetokenizer(
                    self.tokenizer, state.params.skip_special_tokens,
                    start=len(state.prompt_token_ids)))
        state.first_scheduled_time = state.first_scheduled_time or out.first_scheduled_time
        state.error = state.error or out.error
        state.num_cached_tokens = max(state.num_cached_tokens, out.num_cached_tokens)
        sample.num_draft_tokens = out.num_draft_tokens
        sample.num_accepted_tokens = out.num_accepted_tokens
        sample.logprobs += out.new_logprobs or []
        sample.token_times += [now] * len(out.new_token_ids)
        if out.finish_reason is not None:
            sample.finish_reason, sample.finished_time = out.finish_reason, now
        return self._detokenize(sample, out.new_token_ids, state.params)

    def _detokenize(self, sample: SampleState, new_token_ids: list[int],
                    params: SamplingParams) -> bool:
        """Detokenize the new tokens one at a time; True when a stop string ended the sample:
        its text is cut there and any later token of the same step (a speculative step
        appends several) is dropped."""
        det = sample.detokenizer
        tokens = sample.token_ids
        for i, token_id in enumerate(new_token_ids):
            tokens.append(token_id)
            # The token that ended a sample (stop token, length) flushes held-back text.
            final = i == len(new_token_ids) - 1 and sample.finish_reason is not None
            new_text = det.update(tokens, final=final)
            sample.text = det.text
            if final and sample.finish_reason == "stop":
                return False                 # a stop token: its text ends no stop string
            hit = params.stop and new_text and find_stop_string(
                sample.text, new_text, params.stop, params.include_stop_str_in_output)
            if hit:
                sample.text, sample.stop_string = hit
                dropped = len(new_token_ids) - i - 1
                if dropped:
                    del sample.token_times[len(sample.token_times) - dropped:]
                    del sample.logprobs[max(0, len(sample.logprobs) - dropped):]
                sample.finish_reason = "stop"    # over "length", if the core said so too
                sample.finished_time = sample.finished_time or time.perf_counter()
                return True
        if not new_token_ids and sample.finish_reason is not None:
            det.update(tokens, final=True)       # finished with no new token: flush
            sample.text = det.text
        return False


def request_output(state: RequestState) -> RequestOutput:
    samples = [state.samples[i] for i in sorted(state.samples)]
    num_prompt = len(state.prompt_token_ids)
    outputs = [CompletionOutput(
        index=s.index, text=s.text, token_ids=s.token_ids[num_prompt:],
        logprobs=s.logprobs if state.params.logprobs is not None else None,
        finish_reason=s.finish_reason or ("abort" if state.error else None)) for s in samples]
    finished = state.finished
    first = samples[0] if samples else None
    metrics = RequestMetrics(
        arrival_time=state.arrival_time,
        first_scheduled_time=state.first_scheduled_time,
        first_token_time=first.token_times[0] if first and first.token_times else None,
        finished_time=max((s.finished_time or 0 for s in samples), default=0)
        if finished else None,
        num_draft_tokens=sum(s.num_draft_tokens for s in samples),
        num_accepted_tokens=sum(s.num_accepted_tokens for s in samples))
    times = first.token_times if first else []
    return RequestOutput(
        request_id=state.request_id, prompt=state.prompt,
        prompt_token_ids=state.prompt_token_ids, outputs=outputs, finished=finished,
        metrics=metrics,       # gaps listed once, at the end: not O(length) every step
        inter_token_latencies=[b - a for a, b in zip(times, times[1:])] if finished else [],
        error=state.error, num_cached_tokens=state.num_cached_tokens)
