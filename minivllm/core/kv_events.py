"""KV cache events: what the prefix cache names and forgets, told to whoever routes requests
(vLLM twin: vllm/distributed/kv_events.py; its names and fields, the ones minivllm fills).

With kv_events_config={"enable_kv_cache_events": True}, the prefix cache (prefix_cache.py)
records an event each time a full block gets its name (BlockStored), loses it because the
pool hands the block out again (BlockRemoved), or all names go at once (AllBlocksCleared).
A core in its own process sends the events with each step's outputs; the data-parallel front
end keeps, from them alone, an index of the blocks each replica holds (minivllm/routing.py).

A block is named by its hash (prefix_cache.hash_block_tokens), which chains the whole prefix:
the front end computes a new prompt's hashes the same way and counts the leading ones a
replica holds, without ever reading the replica's memory.

Left out, compared with vLLM: the ZMQ publisher (a socket of its own, a replay buffer, topics
for external routers such as llm-d's): here the events ride with the core's outputs to its
own front end; and the events of other media (the CPU tier's blocks: medium "CPU").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None      # the block before the first one (None: a prompt's start)
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str = "GPU"


@dataclass(slots=True)
class BlockRemoved:
    block_hashes: list[int]
    medium: str = "GPU"


@dataclass(slots=True)
class AllBlocksCleared:
    pass
