"""Prefix-aware routing (minivllm/routing.py) from the cores' KV events (core/kv_events.py):
the index built from events alone equals the core's prefix cache after every step, a prompt's
block hashes are computed as the core computes them, and the three policies choose as their
formulas say (the prefix one still balances under skew). tests/test_data_parallel.py runs
them on two real replicas."""

import pytest

from conftest import engine_config
from minivllm import LoRARequest, SamplingParams
from minivllm.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from minivllm.engine.core import EngineCoreRequest
from minivllm.routing import PrefixIndex, Router, block_hashes

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
EVENTS = {"enable_kv_cache_events": True}


def test_the_index_from_events_is_the_prefix_cache_after_every_step(smol):
    """A pool of 24 blocks of 16 tokens, twelve requests sharing prefixes two by two: blocks
    are named, shared, evicted and named again. After every step the index that saw only the
    events holds exactly the hashes the prefix cache holds, and a served prompt's hashes,
    computed as the front end computes them, are found block for block."""
    llm = smol(max_model_len=512, num_kv_blocks=24, block_size=16, max_num_seqs=4,
               kv_events_config=EVENTS)
    client = llm.engine.engine_core          # the in-process client: a core process's own
    cache = llm.engine.block_manager.prefix_cache
    index = PrefixIndex()
    prompts = [llm.tokenizer.encode(f"Topic {i // 2}: " + " ".join(
        f"fact{i // 2}x{j}" for j in range(30)) + f" Question {i}?") for i in range(12)]
    for i, prompt in enumerate(prompts):
        client.add_request(EngineCoreRequest(str(i), prompt, GREEDY))
    kinds, steps = set(), 0
    while client.has_unfinished_requests():
        events = client.get_output().kv_events           # one step's, with its outputs
        kinds |= {type(e) for e in events}
        index.apply(events)
        steps += 1
        assert index.hashes == set(cache.block_of_hash), f"step {steps}"
    assert kinds == {BlockStored, BlockRemoved}          # the pool was too small for all
    hashes = block_hashes(prompts[-1], 16)
    assert 0 < index.num_cached_blocks(hashes) == len(hashes)      # the last one ran last
    assert llm.reset_prefix_cache()
    events = llm.engine.core.take_kv_events()
    assert isinstance(events[-1], AllBlocksCleared)
    index.apply(events)
    assert not index.hashes


def test_events_are_off_by_default(smol):
    llm = smol(max_model_len=256)
    llm.engine.add_request("a", "Hello there, how are you today?", GREEDY)
    assert llm.engine.engine_core.get_output().kv_events == []


def test_the_policies_choose_as_their_formulas_say():
    router = Router(3, engine_config(block_size=4, data_parallel_size=3, kv_events_config=EVENTS,
                                     data_parallel_balance="prefix"))
    prompt = list(range(100, 117))                       # 4 full blocks before the last token
    router.apply(2, [BlockStored(block_hashes(prompt, 4)[:3], None, [], 4, None)])
    # Equal loads: the replica holding 3 of the 4 blocks.
    assert router.choose("a", prompt, [0, 0, 0]) == 2
    assert router.choices[-1].expected_cached_tokens == 12
    # Skewed: the cache is worth PREFIX_WEIGHT x 3/4 = 6 load points, not 8.
    assert router.choose("b", prompt, [0, 5, 5]) == 2
    assert router.choose("c", prompt, [0, 9, 9]) == 0
    # Another adapter's blocks are other blocks: no hit, the least loaded.
    adapter = LoRARequest("adapter", 7, "/unused")
    assert router.choose("d", prompt, [3, 1, 2], adapter) == 1
    router.balance = "score"
    assert router.choose("e", prompt, [3, 1, 2]) == 1
    router.balance = "round_robin"
    assert [router.choose(f"f{i}", prompt, [0, 0, 0]) for i in range(4)] == [0, 1, 2, 0]
    router.apply(2, [BlockRemoved(block_hashes(prompt, 4)[1:2])])
    assert router.indexes[2].num_cached_blocks(block_hashes(prompt, 4)) == 1
    with pytest.raises(ValueError, match="balance must be one of"):
        router.balance = "random"


def test_prefix_routing_needs_the_replicas_events():
    """Refused before any replica starts (DPLBClient makes its Router first)."""
    with pytest.raises(ValueError, match="routes by the replicas' KV events"):
        Router(2, engine_config(data_parallel_size=2, data_parallel_balance="prefix"))
    router = Router(2, engine_config(data_parallel_size=2))
    with pytest.raises(ValueError, match="routes by the replicas' KV events"):
        router.balance = "prefix"


@pytest.mark.parametrize("settings, message", [
    (dict(data_parallel_balance="fastest"), "data_parallel_balance must be"),
    (dict(kv_events_config={"enable_kv_cache_events": True, "publisher": "zmq"}),
     r"unknown key\(s\) \['publisher'\]"),
    (dict(kv_events_config={"enable_kv_cache_events": "yes"}), "must be True or False")])
def test_bad_routing_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        engine_config(**settings)


def test_the_flags_reach_the_engine():
    import argparse

    from minivllm.engine.arg_utils import add_cli_args, engine_kwargs
    args = add_cli_args(argparse.ArgumentParser()).parse_args(
        ["-dp", "2", "--data-parallel-balance", "prefix",
         "--kv-events-config", '{"enable_kv_cache_events": true}'])
    config = engine_config(**{k: v for k, v in engine_kwargs(args).items()
                              if k not in ("dtype", "device")})
    assert config.parallel_config.data_parallel_balance == "prefix"
    assert config.kv_events_config.enable_kv_cache_events
