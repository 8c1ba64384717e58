"""KV offloading (minivllm/kv_offload/): the CPU tier under the prefix cache. Same tokens with
the tier on and off, fewer tokens computed with it, every block of both tiers accounted for
after every step, and the two-tier bookkeeping checked against a model of the pools."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from conftest import engine_config
from minivllm import SamplingParams
from minivllm.core.block_manager import BlockManager
from minivllm.core.kv_cache import KVCacheConfig
from minivllm.core.request import Request
from minivllm.core.scheduler_output import ScheduledRequest, SchedulerOutput
from minivllm.kv_offload.connector import OffloadingConnectorScheduler
from minivllm.kv_offload.manager import CPUOffloadingManager

PROMPTS = [f"Question {i}: tell me about the number {i} and why it matters, at length."
           for i in range(8)]


def tier_is_consistent(manager: CPUOffloadingManager) -> None:
    held = [block for block, _ in manager.table.values()]
    assert len(set(held)) == len(held), "a host block named twice"
    assert not set(held) & set(manager.free_blocks), "a host block both held and free"
    assert len(held) + len(manager.free_blocks) == manager.num_blocks, "host blocks leaked"


def run_stepwise(llm, prompts, params):
    """Step the engine by hand, checking both tiers after every step; -> (token ids, prompt
    tokens computed, the outputs)."""
    engine = llm.engine
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), prompt, p)
    done, computed = {}, 0
    with engine.trace() as steps:
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out
            connector = engine.scheduler.kv_connector
            if connector is not None:
                tier_is_consistent(connector.manager)
            bm = engine.block_manager
            assert bm.num_free_blocks + sum(rc > 0 for rc in bm.ref_counts) == bm.num_blocks
    computed = sum(s.num_tokens for step in steps for s in step.scheduled if s.is_prefill)
    outs = [done[str(i)] for i in range(len(prompts))]
    return [o.outputs[0].token_ids for o in outs], computed, outs


def test_preempted_requests_load_their_blocks_back_and_the_tokens_do_not_change(smol):
    """A pool too small for 8 requests of 24 new tokens: requests are preempted and their
    prompts and outputs computed again, unless the CPU tier holds their blocks. Greedy and
    seeded requests, chunked prefill: the same tokens either way, fewer computed with it."""
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True) if i % 2 else
              SamplingParams(temperature=1.0, seed=i, max_tokens=24, ignore_eos=True)
              for i in range(len(PROMPTS))]
    settings_ = dict(max_model_len=512, num_kv_blocks=12, block_size=16,
                     max_num_batched_tokens=64)
    llm = smol(**settings_)
    ref, computed_off, _ = run_stepwise(llm, PROMPTS, params)
    preempted_off = llm.engine.scheduler.num_preemptions
    llm = smol(**settings_, kv_offloading_size=0.01)
    got, computed_on, outs = run_stepwise(llm, PROMPTS, params)
    manager = llm.engine.scheduler.kv_connector.manager
    assert got == ref
    assert preempted_off > 0 and llm.engine.scheduler.num_preemptions > 0
    assert manager.num_loaded_blocks > 0 and manager.num_stored_blocks > 0
    assert computed_on < computed_off
    print(f"prompt tokens computed: {computed_off} without the tier, {computed_on} with it; "
          f"{manager.num_loaded_blocks} blocks loaded, {manager.num_stored_blocks} stored")
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


def test_a_prefix_the_gpu_pool_evicted_comes_back_from_the_cpu_tier(smol):
    """Four long prompts, then four others that push them out of a 16-block GPU pool, then
    the first four again: without the tier they are computed again; with it their blocks
    load back, RequestOutput.num_cached_tokens says how many, and the tokens are the same."""
    first = [f"Document {i}. " + " ".join(f"word{i}x{j}" for j in range(20)) for i in range(4)]
    other = [p.replace("Document", "Memo") for p in first]
    greedy = SamplingParams(temperature=0, max_tokens=4)

    def second_pass(**tier):
        llm = smol(max_model_len=512, num_kv_blocks=24, block_size=16, max_num_seqs=2, **tier)
        llm.generate(first + other, greedy, use_tqdm=False)
        before = llm.engine.stats()
        outs = llm.generate(first, greedy, use_tqdm=False)
        return ([o.outputs[0].token_ids for o in outs], [o.num_cached_tokens for o in outs],
                before, llm)

    ids_off, cached_off, _, _ = second_pass()
    ids_on, cached_on, before, llm = second_pass(kv_offloading_size=0.05)   # ~70 blocks
    assert ids_on == ids_off
    assert sum(cached_on) > sum(cached_off)
    assert all(n % 16 == 0 for n in cached_on)     # whole blocks, from either tier
    print(f"cached prompt tokens on the second pass: {cached_off} without, {cached_on} with")
    # The counts (EngineStats, /metrics): the requests' cached tokens are both tiers' hits.
    after = llm.engine.stats()
    hits = lambda s: s.prefix_cache_hit_tokens + s.external_prefix_cache_hit_tokens  # noqa
    assert hits(after) - hits(before) == sum(cached_on)
    assert after.external_prefix_cache_hit_tokens > before.external_prefix_cache_hit_tokens
    block_bytes = llm.engine.runner.block_bytes
    assert after.kv_offload_load_bytes == after.kv_offload_loaded_blocks * block_bytes > 0
    assert after.kv_offload_store_bytes == after.kv_offload_stored_blocks * block_bytes > 0
    assert 0 < after.kv_offload_usage <= 1
    from minivllm.entrypoints.openai.api_server import EngineCollector
    engine = type("Front", (), {"stats": lambda _: after, "replica_stats": lambda _: [after]})
    metrics = {m.name: m.samples[0].value for m in EngineCollector(engine()).collect()}
    assert metrics["minivllm:external_prefix_cache_hits"] == after.external_prefix_cache_hit_tokens
    assert metrics["minivllm:kv_offload_load_bytes"] == after.kv_offload_load_bytes
    assert metrics["minivllm:kv_offload_usage_perc"] == after.kv_offload_usage


def test_reset_prefix_cache_empties_both_tiers(smol):
    llm = smol(max_model_len=256, kv_offloading_size=0.01)
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)
    manager = llm.engine.scheduler.kv_connector.manager
    assert manager.num_used_blocks > 0
    assert llm.reset_prefix_cache()
    assert manager.num_used_blocks == 0 and len(llm.engine.block_manager.prefix_cache) == 0
    tier_is_consistent(manager)


@pytest.mark.parametrize("settings_, message", [
    (dict(kv_offloading_size=0), "positive number of GiB"),
    (dict(swap_space=-1), "positive number of GiB"),
    (dict(kv_offloading_size=1, kv_offloading_backend="lmcache"), "must be 'native'"),
    (dict(pipeline_parallel_size=2, preemption_mode="swap"), "needs one pipeline stage"),
    (dict(kv_offloading_size=1, preemption_mode="swap"), "successor to V0's swap"),
    (dict(kv_offloading_size=1, kv_layout="contiguous"), "needs kv_layout='paged'"),
    (dict(kv_offloading_size=1, kv_transfer_config={"kv_role": "kv_producer"}),
     "one KV connector at a time")])
def test_bad_offloading_settings_are_refused(settings_, message):
    with pytest.raises(ValueError, match=message):
        engine_config(**settings_)


def test_the_serve_flags_reach_the_engine():
    import argparse

    from minivllm.engine.arg_utils import add_cli_args, engine_kwargs
    args = add_cli_args(argparse.ArgumentParser()).parse_args(["--kv-offloading-size", "2.5"])
    kwargs = engine_kwargs(args)
    assert kwargs["kv_offloading_size"] == 2.5 and kwargs["kv_offloading_backend"] == "native"


# ---------------------------------------------------------------- the two tiers, as a model
NUM_GPU, NUM_CPU, BS = 8, 6, 2


class TwoTierMachine(RuleBasedStateMachine):
    """Requests over a 4-token alphabet (prefixes repeat) admitted, computed and freed through
    the BlockManager and the connector's scheduler side, their transfers applied to two fake
    pools (a block's tokens): every block a request holds must hold its tokens, every tier
    entry the tokens its key names."""

    def __init__(self):
        super().__init__()
        self.bm = BlockManager(NUM_GPU, BS, enable_prefix_caching=True)
        self.connector = OffloadingConnectorScheduler(KVCacheConfig(NUM_GPU, NUM_CPU), self.bm)
        self.gpu = [None] * NUM_GPU
        self.cpu = [None] * NUM_CPU
        self.live: list[Request] = []
        self.n = 0

    @rule(tokens=st.lists(st.integers(0, 3), min_size=1, max_size=4 * BS + 1))
    def run_a_request(self, tokens):
        request = Request(f"r{self.n}", tokens, SamplingParams())
        self.n += 1
        if not self.bm.can_allocate(request):
            return
        self.bm.allocate(request)
        self.connector.update_state_after_alloc(request)
        start = request.num_computed_tokens
        assert start < len(tokens)                    # the last token is always computed
        record = ScheduledRequest(request.request_id, len(tokens) - start, True,
                                  num_computed_tokens=start)
        self.bm.cache_computed_blocks(request, len(tokens))
        meta = self.connector.build_connector_meta(SchedulerOutput(scheduled=[record]),
                                                   {request.request_id: request})
        for host, device in meta.loads if meta else []:          # before the forward
            self.gpu[device] = self.cpu[host]
        for i, block in enumerate(request.block_table):          # the forward
            chunk = tuple(tokens[i * BS:(i + 1) * BS])
            if (i + 1) * BS > start:
                self.gpu[block] = chunk
            assert self.gpu[block] == chunk, "a loaded or cached block holds other tokens"
        for device, host in meta.stores if meta else []:         # after it
            self.cpu[host] = self.gpu[device]
        request.num_computed_tokens = len(tokens)
        self.live.append(request)

    @rule(data=st.data())
    def free_one(self, data):
        if self.live:
            self.bm.free(self.live.pop(data.draw(st.integers(0, len(self.live) - 1))))

    @invariant()
    def tiers_hold_what_they_name(self):
        tier_is_consistent(self.connector.manager)
        for host, key in self.connector.manager.table.values():
            assert self.cpu[host] == key[1]


TestTwoTiers = TwoTierMachine.TestCase
TestTwoTiers.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
