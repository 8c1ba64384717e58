"""The Scheduler and BlockManager (minivllm/core/) on their own: no model, no tensors, no
tokenizer, in the spirit of vLLM's tests/v1/core/test_scheduler.py. A request is made-up token
ids; `step` below is the engine's own EngineCore.step (minivllm/engine/core.py) over FakeExecutor,
an executor with no model; `run_step` finishes a step whose schedule a test has looked into.
FakeExecutor samples the rows the scheduler marked (SchedulerOutput.sampling): the rule is not
copied here.

Every test asserts exact counts (tokens per sequence, blocks, queue order) that a change in
the rule it names would break.
"""

from __future__ import annotations

import itertools
import weakref

import pytest

from minivllm import LoRARequest
from minivllm.config.scheduler import V0_SCHEDULER
from minivllm.core.kv_cache import KVCacheConfig
from minivllm.core.scheduler import Scheduler, SchedulerOutput
from minivllm.core.request import Request, RequestStatus
from minivllm.engine.core import EngineCore, EngineCoreRequest
from minivllm.outputs import ModelRunnerOutput
from minivllm.sampling_params import SamplingParams

from conftest import engine_config

TOKEN_IDS = itertools.count()
CORES: weakref.WeakKeyDictionary[Scheduler, EngineCore] = weakref.WeakKeyDictionary()


class FakeExecutor:
    """execute_model with no model, reading only what a worker receives (the messages of
    SchedulerOutput, keyed by request id): it keeps each request's tokens as the runner does
    (new requests whole, then the tokens the core appended, forgotten when finished), and
    every request the scheduler marked as sampling draws token 900 + its length, after its
    accepted drafts (`accepted[request_id]`, default all)."""

    def __init__(self, num_blocks: int, num_cpu_blocks: int):
        self.kv_cache_config = KVCacheConfig(num_blocks, num_cpu_blocks)
        self.accepted: dict[str, int] = {}
        self.tokens: dict[str, list[int]] = {}       # request id -> its tokens, as told

    def execute_model(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for req_id in out.finished_req_ids:
            del self.tokens[req_id]
        for new in out.scheduled_new_reqs:
            self.tokens[new.req_id] = list(new.token_ids)
        cached = out.scheduled_cached_reqs
        for req_id, new_token_ids in zip(cached.req_ids, cached.new_token_ids):
            self.tokens[req_id] += new_token_ids
        result = ModelRunnerOutput()
        for req_id, samples in zip(out.req_ids, out.sampling):
            if samples:
                drafts = out.scheduled_spec_decode_tokens.get(req_id, [])
                kept = drafts[:self.accepted.get(req_id, len(drafts))]
                length = len(self.tokens[req_id])
                result.sampled[req_id] = [(t, None) for t in kept + [900 + length + len(kept)]]
        return result


def make_scheduler(*, num_cpu_blocks: int = 0, **config_overrides) -> Scheduler:
    """A small engine core's scheduler: blocks of 4 tokens, 16 of them, a 64-token budget
    (scheduler_cls=V0_SCHEDULER, or swap or static batching: V0's, which forks n > 1).
    Prefix caching is off unless a test turns it on, so block counts do not depend on what
    earlier requests left cached. num_cpu_blocks > 0 gives it a swap pool (the engine sizes
    that one from swap_space; here it is a count)."""
    settings = {"max_model_len": 64, "max_num_seqs": 8, "max_num_batched_tokens": 64,
                "block_size": 4, "num_kv_blocks": 16, "enable_prefix_caching": False}
    config = engine_config(**(settings | config_overrides))
    core = EngineCore(config, FakeExecutor(config.cache_config.num_kv_blocks, num_cpu_blocks),
                      set())
    CORES[core.scheduler] = core
    return core.scheduler


def add_request(scheduler: Scheduler, request_id: str, prompt: int | list[int], *,
                max_tokens: int = 16, n: int = 1, lora_int_id: int = 0) -> Request:
    """Queue a request in the scheduler's core; `prompt` is its token ids, or a length (then
    ids no other request has). Returns its first sequence."""
    if isinstance(prompt, int):
        first = 1000 * next(TOKEN_IDS)
        prompt = list(range(first, first + prompt))
    params = SamplingParams(n=n, max_tokens=max_tokens)
    lora = LoRARequest(f"adapter-{lora_int_id}", lora_int_id, "/unused") if lora_int_id else None
    CORES[scheduler].add_request(EngineCoreRequest(request_id, prompt, params, lora))
    return scheduler.requests.get(request_id) or scheduler.requests[f"0_{request_id}"]


def names(seqs) -> list[str]:
    """Request ids ("A"; sample i of an n > 1 request V0 forks in the core: "i_A") of requests,
    ScheduledRequest records or ids."""
    return [s if isinstance(s, str) else s.request_id for s in seqs]


def tokens(out: SchedulerOutput) -> list[int]:
    """Tokens each scheduled request computes this step (drafts included), in batch order."""
    return [r.num_tokens for r in out.scheduled]


def prefills(out: SchedulerOutput) -> list[bool]:
    return [r.is_prefill for r in out.scheduled]


def drafts(out: SchedulerOutput) -> list[list[int]]:
    """The draft tokens each verifies: the runner's message, in batch order."""
    return [out.scheduled_spec_decode_tokens.get(r.request_id, []) for r in out.scheduled]


def run_step(scheduler: Scheduler, out: SchedulerOutput,
             accepted: dict[str, int] | None = None) -> None:
    """The rest of a step whose schedule() a test has looked into: FakeExecutor's output, applied
    by Scheduler.update_from_output, as EngineCore.step does."""
    fake = CORES[scheduler].model_executor
    fake.accepted = accepted or {}
    scheduler.update_from_output(out, fake.execute_model(out))


def step(scheduler: Scheduler, accepted: dict[str, int] | None = None) -> SchedulerOutput:
    """One EngineCore.step over FakeExecutor; returns what was scheduled."""
    core = CORES[scheduler]
    fake = core.model_executor
    fake.accepted = accepted or {}
    core.step()
    return core.last_scheduler_output


def test_the_token_budget_fills_up_and_the_last_prompt_is_chunked():
    s = make_scheduler(max_num_batched_tokens=10)
    for name in "ABCD":
        add_request(s, name, 4)
    out = step(s)
    assert names(out.scheduled) == ["A", "B", "C"]
    assert tokens(out) == [4, 4, 2]                  # C gets what the budget has left
    assert prefills(out) == [True, True, True]
    assert names(s.waiting) == ["D"]
    out = s.schedule()                 # decodes, C's last 2 prompt tokens, then D's whole prompt
    assert names(out.scheduled) == ["A", "B", "C", "D"]
    assert tokens(out) == [1, 1, 2, 4]
    assert prefills(out) == [False, False, True, True]
    assert out.num_batched_tokens == 8


def test_max_num_seqs_caps_the_batch_until_a_sequence_finishes():
    s = make_scheduler(max_num_seqs=3)
    add_request(s, "A", 4, max_tokens=2)
    for name in "BCD":
        add_request(s, name, 4)
    assert tokens(step(s)) == [4, 4, 4]
    out = step(s)                                           # A's second token: A is done
    assert names(out.scheduled) == ["A", "B", "C"] and names(s.waiting) == ["D"]
    assert s.block_manager.num_free_blocks == 16 - 2 - 2    # A's two blocks are back
    out = s.schedule()
    assert names(out.scheduled) == ["B", "C", "D"]
    assert tokens(out) == [1, 1, 4]


def test_without_chunked_prefill_a_prompt_waits_for_a_step_it_fits_in_whole():
    s = make_scheduler(enable_chunked_prefill=False, num_kv_blocks=32)
    for name in "ABC":
        add_request(s, name, 30)
    out = step(s)
    assert names(out.scheduled) == ["A", "B"]
    assert tokens(out) == [30, 30]                  # 4 left < 30
    assert names(s.waiting) == ["C"]
    assert tokens(s.schedule()) == [1, 1, 30]


def test_chunked_prefill_runs_beside_decodes():
    s = make_scheduler(max_num_batched_tokens=8)
    a = add_request(s, "A", 3)
    assert tokens(step(s)) == [3]
    b = add_request(s, "B", 20)
    chunks = []
    for _ in range(4):
        out = step(s)
        chunks.append((tokens(out), prefills(out), b.num_output_tokens))
    assert chunks == [([1, 7], [False, True], 0),          # A decodes while B prefills...
                      ([1, 7], [False, True], 0),
                      ([1, 6], [False, True], 1),          # ...B's last chunk samples
                      ([1, 1], [False, False], 2)]
    assert (out.num_prefill_tokens, out.num_decode_tokens) == (0, 2)
    assert a.num_output_tokens == 5 and b.num_computed_tokens == 21


def test_recompute_preempts_the_newest_first_and_requeues_it_at_the_front():
    s = make_scheduler(num_kv_blocks=4)
    a = add_request(s, "A", 4, max_tokens=3)
    for name in "BCD":
        add_request(s, name, 4)
    step(s)                                  # one block each; each now needs a second one
    out = step(s)
    assert names(out.preempted) == ["D", "C"]              # newest first
    assert names(out.scheduled) == ["A", "B"] and tokens(out) == [1, 1]
    assert names(s.waiting) == ["C", "D"]                  # back in arrival order, in front
    c = s.waiting[0]
    assert (c.status, c.num_computed_tokens, c.block_table, len(c)) == (
        RequestStatus.WAITING, 0, [], 5)                  # KV dropped, its token kept
    assert s.num_preemptions == 2 and s.block_manager.num_free_blocks == 0
    out = step(s)                                          # A's third token: A is done
    assert a.is_finished and s.block_manager.num_free_blocks == 2
    out = s.schedule()                                     # C recomputes prompt + its token
    assert names(out.scheduled) == ["B", "C"]
    assert tokens(out) == [1, 5] and prefills(out) == [False, True]
    assert names(s.waiting) == ["D"]


def test_swap_preempts_the_newest_first_and_swaps_back_before_any_admission():
    s = make_scheduler(num_kv_blocks=4, preemption_mode="swap", num_cpu_blocks=8)
    add_request(s, "A", 4, max_tokens=3)
    for name in "BCD":
        add_request(s, name, 4)
    step(s)
    out = step(s)
    assert names(out.preempted) == names(out.swapped_out) == ["D", "C"]
    assert len(out.blocks_to_swap_out) == 2                # one block each
    assert names(s.swapped) == ["D", "C"] and not s.waiting
    d = s.swapped[0]
    assert d.status is RequestStatus.SWAPPED and d.num_computed_tokens == 4   # KV kept
    assert s.cpu_block_manager.num_free_blocks == 6
    add_request(s, "E", 4)
    out = step(s)                                          # no room; E may not jump the queue
    assert names(out.scheduled) == ["A", "B"] and names(s.waiting) == ["E"]
    out = s.schedule()                                     # A finished: 2 blocks free
    assert names(out.swapped_in) == ["D"]                  # in the order they went out
    assert names(out.scheduled) == ["B", "D"] and tokens(out) == [1, 1]
    assert prefills(out) == [False, False]                # D's KV came back: a decode
    assert len(out.blocks_to_swap_in) == 1 and s.block_manager.num_free_blocks == 0
    assert names(s.swapped) == ["C"] and names(s.waiting) == ["E"]
    assert s.cpu_block_manager.num_free_blocks == 7


def test_a_new_request_that_would_fit_waits_while_any_sequence_is_swapped_out():
    s = make_scheduler(num_kv_blocks=3, preemption_mode="swap", num_cpu_blocks=8)
    add_request(s, "A", 4, max_tokens=2)
    for name in "BC":
        add_request(s, name, 4)
    step(s)
    out = step(s)                                          # B preempts itself; A is done
    assert names(out.swapped_out) == ["C", "B"] and s.block_manager.num_free_blocks == 3
    add_request(s, "E", 3)                                 # one block
    out = s.schedule()
    assert names(out.scheduled) == ["C"]  # C back in (2 blocks), B needs 2
    assert names(s.swapped) == ["B"] and names(s.waiting) == ["E"]
    assert s.block_manager.num_free_blocks == 1            # E would fit, but waits for B


def test_swap_falls_back_to_recompute_when_the_host_pool_is_full():
    s = make_scheduler(num_kv_blocks=4, preemption_mode="swap", num_cpu_blocks=1)
    for name in "ABCD":
        add_request(s, name, 4)
    step(s)
    out = s.schedule()
    assert names(out.preempted) == ["D", "C"] and names(out.swapped_out) == ["D"]
    assert names(s.swapped) == ["D"] and names(s.waiting) == ["C"]


def test_prefix_cache_hits_blocks_named_as_they_are_scheduled():
    """A's full blocks are named when A is scheduled, so A2, admitted after it in the same
    step, finds them (vLLM V1 does the same: the step's K/V is written before attention)."""
    s = make_scheduler(enable_prefix_caching=True)
    prompt = list(range(10))                               # two full blocks and 2 tokens
    add_request(s, "A", prompt)
    a2 = add_request(s, "A2", prompt)
    out = step(s)
    assert tokens(out) == [10, 2]                   # A2: only its partly filled block
    assert a2.block_table[:2] == s.requests["A"].block_table[:2]
    b = add_request(s, "B", prompt[:8] + [50, 51, 52])
    c = add_request(s, "C", prompt[:8])                    # all cached, but its last token
    out = s.schedule()                                     # must be computed for its logits
    assert names(out.scheduled) == ["A", "A2", "B", "C"]
    assert tokens(out) == [1, 1, 3, 4]
    assert (b.num_computed_tokens, c.num_computed_tokens) == (8, 4)
    a = s.requests[out.scheduled[0].request_id]
    assert b.block_table[:2] == a.block_table[:2] and c.block_table[0] == a.block_table[0]
    assert c.block_table[1] != a.block_table[1]
    refs = s.block_manager.ref_counts
    assert (refs[a.block_table[0]], refs[a.block_table[1]]) == (4, 3)    # A2 too
    cache = s.block_manager.prefix_cache
    assert (cache.num_queried_tokens, cache.num_hit_tokens) == (10 + 10 + 11 + 8, 8 + 8 + 4)


def test_draft_tokens_take_budget_and_lookahead_slots_and_give_back_the_rejected_ones():
    s = make_scheduler()
    a = add_request(s, "A", 4)
    step(s)
    s.update_draft_token_ids({"A": [7, 7, 7, 7]})     # what the runner proposed
    out = s.schedule()
    assert tokens(out) == [5] and drafts(out) == [[7, 7, 7, 7]]
    assert len(a.block_table) == 3                         # 5 tokens + 4 lookahead slots
    assert s.block_manager.num_free_blocks == 13
    run_step(s, out, accepted={"A": 1})                    # 1 draft accepted, then 1 token
    assert len(a) == 7 and a.token_ids[5] == 7 and a.num_computed_tokens == 6
    assert len(a.block_table) == 2 and s.block_manager.num_free_blocks == 14
    assert a.spec_token_ids == []


def test_drafts_get_only_what_the_budget_leaves_after_one_token_each():
    s = make_scheduler(max_num_batched_tokens=3)
    a = add_request(s, "A", 1)
    b = add_request(s, "B", 1)
    step(s)
    a.spec_token_ids = [7, 7, 7]
    b.spec_token_ids = [8, 8]
    out = s.schedule()
    assert tokens(out) == [2, 1]                    # A: 1 + 1 draft; B: its token
    assert drafts(out) == [[7], []]


def test_drafts_are_dropped_not_paid_for_by_a_preemption_when_blocks_run_out():
    s = make_scheduler(num_kv_blocks=3)
    a = add_request(s, "A", 6)                             # 2 blocks: 8 slots
    add_request(s, "B", 3)                                 # the last block, room for 1 more
    step(s)
    a.spec_token_ids = [7, 7]                              # 7 tokens + 2 need a third block
    out = s.schedule()
    assert tokens(out) == [1, 1] and drafts(out) == [[], []]
    assert out.preempted == [] and len(a.block_table) == 2


def test_abort_frees_every_block_in_every_state():
    s = make_scheduler(num_kv_blocks=10, max_num_batched_tokens=8, preemption_mode="swap",
                       num_cpu_blocks=8, enable_prefix_caching=True)
    a = add_request(s, "A", list(range(8)), n=2, max_tokens=40)
    step(s)
    add_request(s, "B", list(range(8)) + [1, 2], max_tokens=40)    # hits A's two blocks
    c = add_request(s, "C", list(range(100, 120)), max_tokens=40)   # shares nothing
    add_request(s, "D", 30)
    for _ in range(4):
        step(s)
    # Forked and prefix-shared blocks, one sequence swapped out mid-prefill, one never admitted.
    assert names(s.running) == ["0_A", "1_A", "B"] and s.block_manager.ref_counts[
        a.block_table[0]] == 3
    assert names(s.swapped) == ["C"] and c.num_computed_tokens == 4
    assert names(s.waiting) == ["D"]
    assert s.block_manager.num_free_blocks == 3 and s.cpu_block_manager.num_free_blocks == 3
    for seq in [s.swapped[0], s.running[1], s.waiting[0], *s.running]:    # 1_A before 0_A
        s.finish(seq, RequestStatus.FINISHED_ABORTED)
    assert not s.has_unfinished()
    # Every block back exactly once: a leak leaves one out, a double free fails an assert.
    assert s.block_manager.num_free_blocks == 10 and not any(s.block_manager.ref_counts)
    assert s.cpu_block_manager.num_free_blocks == 8 and not any(s.cpu_block_manager.ref_counts)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_requests_run_to_the_end_under_preemption_and_leave_no_block_behind(mode):
    s = make_scheduler(num_kv_blocks=8, max_num_batched_tokens=16, preemption_mode=mode,
                       num_cpu_blocks=4, scheduler_cls=V0_SCHEDULER)
    for i, name in enumerate("ABCDEF"):
        add_request(s, name, 3 + 2 * i, max_tokens=6, n=2 if name == "B" else 1)
    steps = 0
    while s.has_unfinished():
        step(s)
        steps += 1
        assert steps < 100, s.running
    assert s.num_preemptions > 0
    assert s.block_manager.num_free_blocks == 8 and not any(s.block_manager.ref_counts)
    if mode == "swap":                    # recompute has no host pool
        assert s.cpu_block_manager.num_free_blocks == 4
    else:
        assert s.cpu_block_manager is None


@pytest.mark.parametrize("prompt_len, copies, new_blocks", [(6, 2, 2), (8, 2, 3)])
def test_n_samples_fork_onto_shared_blocks_and_copy_on_write(prompt_len, copies, new_blocks):
    s = make_scheduler(max_num_seqs=3, scheduler_cls=V0_SCHEDULER)
    a = add_request(s, "A", prompt_len, n=3)
    out = step(s)
    assert tokens(out) == [prompt_len]              # the prompt is prefilled once
    assert names(s.running) == ["0_A", "1_A", "2_A"]
    table = list(a.block_table)
    assert [s.block_manager.ref_counts[b] for b in table] == [3, 3]
    assert s.block_manager.num_free_blocks == 14
    out = s.schedule()
    assert tokens(out) == [1, 1, 1]
    # Sample 0 writes its first token, samples 1 and 2 their prompt's last token again (their
    # logits row), all into block 1 with 6 tokens: the first two to write copy it, the last is
    # then its only holder. 8 tokens: sample 0's token starts block 2; 1 and 2 copy block 1.
    assert len(out.blocks_to_copy) == copies == s.block_manager.num_copy_on_write
    assert s.block_manager.ref_counts[table[0]] == 3
    assert s.block_manager.num_free_blocks == 14 - new_blocks


def test_a_request_waits_when_running_samples_yet_to_fork_fill_max_num_seqs():
    """A (n=3) holds three of the three sequence slots before it forks: B waits (it used to
    be admitted beside it, and four sequences ran under max_num_seqs=3)."""
    s = make_scheduler(max_num_seqs=3, max_num_batched_tokens=4, scheduler_cls=V0_SCHEDULER)
    add_request(s, "A", 6, n=3)
    add_request(s, "B", 4)
    assert names(step(s).scheduled) == ["0_A"]              # A's first chunk of 4
    out = s.schedule()                                        # A's last 2; B still waits
    assert names(out.scheduled) == ["0_A"] and names(s.waiting) == ["B"]
    run_step(s, out)
    assert names(s.running) == ["0_A", "1_A", "2_A"] and len(s.running) <= 3


def test_static_scheduling_admits_only_into_an_empty_batch():
    def first_two_steps(mode):
        s = make_scheduler(scheduling=mode)
        add_request(s, "A", 4, max_tokens=1)
        add_request(s, "B", 4, max_tokens=3)
        first = names(step(s).scheduled)  # A is done after its first token
        add_request(s, "C", 4)
        return s, first, names(step(s).scheduled)

    assert first_two_steps("continuous")[1:] == (["A", "B"], ["B", "C"])
    s, first, second = first_two_steps("static")
    assert (first, second) == (["A", "B"], ["B"])          # C waits for B
    assert names(step(s).scheduled) == ["B"]                    # B's last token
    assert names(s.schedule().scheduled) == ["C"]


def test_max_loras_limits_the_distinct_adapters_running_at_once():
    s = make_scheduler(enable_lora=True, max_loras=1)
    add_request(s, "A", 4, lora_int_id=1, max_tokens=1)
    add_request(s, "B", 4, lora_int_id=1, max_tokens=1)
    add_request(s, "C", 4, lora_int_id=2)
    add_request(s, "D", 4)                                 # the base model: no slot needed
    assert names(step(s).scheduled) == ["A", "B"]  # C waits for a slot, D behind it
    assert names(s.waiting) == ["C", "D"]
    assert names(s.schedule().scheduled) == ["C", "D"]  # A and B are done: slot free
    s = make_scheduler(enable_lora=True, max_loras=2)
    for name, lora in zip("ABCD", (1, 1, 2, 0)):
        add_request(s, name, 4, lora_int_id=lora)
    assert names(s.schedule().scheduled) == ["A", "B", "C", "D"]


# ----------------------------------------------------------- update_from_output on its own
def test_update_appends_up_to_a_stop_token_and_frees_the_blocks():
    s = make_scheduler()
    s.eos_token_ids = {7}
    a = add_request(s, "A", 4)
    out = s.schedule()
    s.update_from_output(out, ModelRunnerOutput(sampled={a.request_id: [(5, None)]}))
    out = s.schedule()
    a.spec_token_ids = []
    # Three draws, the second a stop token: the third is never appended.
    s.update_from_output(out, ModelRunnerOutput(sampled={a.request_id: [(6, None), (7, None),
                                                                  (8, None)]}))
    assert a.output_token_ids == [5, 6, 7] and a.status is RequestStatus.FINISHED_STOPPED
    assert s.block_manager.num_free_blocks == 16 and not s.running
    assert s.finished_req_ids == {"A"}           # the runner learns it at the next step
    assert s.schedule().finished_req_ids == {"A"} and not s.finished_req_ids


def test_update_counts_accepted_drafts_and_rolls_back_the_rest():
    s = make_scheduler()
    a = add_request(s, "A", 4)
    step(s)                                                   # prefill: 5 tokens
    a.spec_token_ids = [11, 12, 13, 14]
    out = s.schedule()
    assert tokens(out) == [5] and len(a.block_table) == 3   # 5 + 4 drafts: 9 slots
    step_result = ModelRunnerOutput(sampled={a.request_id: [(11, None), (20, None)]})  # 1 accepted
    s.update_from_output(out, step_result)
    assert a.output_token_ids[-2:] == [11, 20] and a.num_computed_tokens == len(a) - 1 == 6
    assert len(a.block_table) == 2                            # the rejected drafts' slots freed
    stats = s.spec_decoding_stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 4, 1)
    assert a.metrics.num_draft_tokens == 4 and a.metrics.num_accepted_tokens == 1


def test_a_sampling_error_aborts_that_request_alone():
    s = make_scheduler()
    a = add_request(s, "A", 4)
    b = add_request(s, "B", 4)
    out = s.schedule()
    s.update_from_output(out, ModelRunnerOutput(sampled={b.request_id: [(5, None)]},
                                                errors={"A": "sampling failed: boom"}))
    assert a.status is RequestStatus.FINISHED_ABORTED and a.error.endswith("boom")
    assert names(s.running) == ["B"] and b.output_token_ids == [5]
    assert s.block_manager.num_free_blocks == 16 - 1           # only B's prompt block


def test_a_prefilled_request_is_admitted_with_the_normal_checks():
    s = make_scheduler(max_num_seqs=1)
    add_request(s, "A", 4)
    step(s)
    seq = Request("P", list(range(8)), SamplingParams(max_tokens=4))
    assert not s.add_prefilled(seq, (42, None))                 # max_num_seqs is full
    assert seq.block_table == []
    s.finish(s.running[0], RequestStatus.FINISHED_ABORTED)
    assert s.add_prefilled(seq, (42, None))
    assert seq.num_computed_tokens == 8 and seq.output_token_ids == [42]
    assert seq.status is RequestStatus.RUNNING and names(s.running) == ["P"]
    assert tokens(s.schedule()) == [1]                 # it decodes from its first token
