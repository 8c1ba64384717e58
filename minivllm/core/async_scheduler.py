"""AsyncScheduler: step N + 1 is scheduled while step N runs (vLLM twin:
vllm/v1/core/sched/async_scheduler.py; `async_scheduling=True`, `--async-scheduling`).

A synchronous engine leaves the device idle while the host schedules, prepares the inputs and
processes the outputs of each step. With async scheduling the core keeps two batches in flight
(EngineCore.step_with_batch_queue, the queue pipeline parallelism uses): while the worker runs
step N, the core schedules step N + 1 and applies step N - 1's output. A request decoding in
step N is scheduled again in step N + 1 before its token from step N is back: the core counts
that token as a placeholder (`num_output_placeholders`, V1's name), and the worker, which
sampled it, puts it in its own state of the request (worker/model_runner.py) and computes it.

What changes against Scheduler, the two places the timing shows:

    at schedule   a request's computed count advances by the tokens scheduled (V1 does so in
                  every mode), and a request that samples gets a placeholder; so the next
                  schedule sees its next token as uncomputed before knowing it
    at update     the placeholder is replaced by the real token (Scheduler._append); the
                  computed count is already right

A request that stopped in step N (EOS, max_tokens, a stop string, an abort) was still
scheduled in step N + 1: that step's token for it is computed and dropped (V1 too). A guided
request waits for its batch: its grammar must see a token before the next mask is built. A
request with a batch in flight is never preempted (its blocks are being written); if none is
free, the one that needs room waits for the batch to come back. The sampled ids reach the
host before the next step on each worker (V1 keeps them on the device).
"""

from __future__ import annotations

from minivllm.core.request import Request
from minivllm.core.scheduler import Scheduler
from minivllm.core.scheduler_output import ScheduledRequest, SchedulerOutput


class AsyncScheduler(Scheduler):
    def _run(self, request: Request, out: SchedulerOutput, budget: int) -> int:
        budget = super()._run(request, out, budget)
        record = out.scheduled[-1]
        request.num_computed_tokens += record.num_tokens     # V1's _update_after_schedule
        if record.samples:
            request.num_output_placeholders += 1
        # The worker appends each token it samples to its own state: it holds them already.
        self.runner_holds[request.request_id] = len(request) + request.num_output_placeholders
        return budget

    def _update_after_step(self, request: Request, record: ScheduledRequest) -> None:
        if record.samples:                   # its token is about to be appended (_append)
            request.num_output_placeholders -= 1

    def _waits_for_batch(self, request: Request) -> bool:
        return request.matcher is not None and request.request_id in self.in_flight
