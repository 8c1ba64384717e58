"""Which data-parallel replica a request goes to: the front end's router (engine/multiproc/
dp_client.py) and the simulator's (simulator/simulator.py) are this one.

    router = Router(num_replicas=2, vllm_config)      # data_parallel_balance="prefix"
    rank = router.choose(request_id, prompt_token_ids, loads, lora_request)
    router.apply(rank, outputs.kv_events)      # what replica `rank` cached or dropped

Three policies (`data_parallel_balance`, `--data-parallel-balance`):

    round_robin   request i to replica i mod N: the baseline
    score         vLLM V1's before 0.33: the lowest load, 4 x waiting + running (load_score)
    prefix        the lowest  load - PREFIX_WEIGHT x (share of the prompt's full blocks the
                  replica holds): a whole prompt cached is worth two waiting requests, so
                  equal loads go to the replica with the longest cached prefix, and a replica
                  more than two requests busier than another is not chosen for its cache

The prefix policy knows what each replica caches only from its KV events (core/kv_events.py,
on with kv_events_config): a PrefixIndex per replica, the hashes of the blocks it holds, kept
by BlockStored, BlockRemoved and AllBlocksCleared, never by reading a replica's memory. A new
prompt's block hashes are computed as the cores compute them (core/prefix_cache.py's
hash_block_tokens, the same ints in every process), so the leading ones an index holds are the
blocks that replica would find. The index lags its replica by the events in flight (a step);
a replica that dies takes its index with it (the front end stops), and reset_prefix_cache or a
reconfigure empties every index at once. Each choice is recorded (`choices`): the replica and
the cached tokens it expected, for the tests, bench parallel and lesson 18.

No vLLM twin inside vLLM: its DP client balances by load alone; routers built on its KV events
live outside it (llm-d's precise prefix-cache scorer, the production-stack router). Left out:
their load estimates from the replicas' own queues (here the front end's snapshot), and
routing by the CPU tier's blocks.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

from minivllm.config.parallel import DP_BALANCES
from minivllm.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from minivllm.core.prefix_cache import hash_block_tokens

PREFIX_WEIGHT = 8     # load points a fully cached prompt is worth: two waiting requests
MAX_CHOICES = 10_000  # choices kept (a server runs for days)


def load_score(stats, num_unseen: int) -> int:
    """vLLM V1's load score of a replica (before 0.33): 4 x waiting + running, from its last
    stats snapshot (an EngineStats), the requests sent to it since whose first output has not
    come back counted as waiting."""
    return 4 * (stats.num_waiting + num_unseen) + stats.num_running


def block_hashes(token_ids: list[int], block_size: int, extra_keys: tuple = ()) -> list[int]:
    """The hashes of a prompt's full blocks that a replica could have cached: all but the one
    holding its last token, which is always computed (BlockManager._cached_prefix)."""
    hashes: list[int] = []
    for i in range((len(token_ids) - 1) // block_size):
        block = tuple(token_ids[i * block_size:(i + 1) * block_size])
        hashes.append(hash_block_tokens(hashes[-1] if hashes else None, block, extra_keys))
    return hashes


class PrefixIndex:
    """One replica's cached blocks, as its KV events told them: the set of their hashes."""

    def __init__(self):
        self.hashes: set[int] = set()

    def apply(self, events) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                self.hashes.update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                self.hashes.difference_update(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.hashes.clear()

    def num_cached_blocks(self, hashes: list[int]) -> int:
        """How many of a prompt's leading blocks this replica holds."""
        n = 0
        while n < len(hashes) and hashes[n] in self.hashes:
            n += 1
        return n


@dataclass(slots=True)
class Choice:
    request_id: str
    rank: int
    expected_cached_tokens: int    # what its index said the replica holds of the prompt


class Router:
    def __init__(self, num_replicas: int, vllm_config):
        """vllm_config: the replicas' (their block size, whether they send KV events, the
        balance to start with: data_parallel_balance)."""
        self.indexes = [PrefixIndex() for _ in range(num_replicas)]
        self.choices: deque[Choice] = deque(maxlen=MAX_CHOICES)     # the latest
        self._cycle = itertools.cycle(range(num_replicas))
        self.configure(vllm_config)

    def configure(self, vllm_config) -> None:
        """The replicas' new config (LLM.reconfigure): fresh pools, so every index empties."""
        events = vllm_config.kv_events_config
        self.events = bool(events and events.enable_kv_cache_events)
        self.block_size = vllm_config.cache_config.block_size
        self.balance = vllm_config.parallel_config.data_parallel_balance
        self.clear()

    @property
    def balance(self) -> str:
        return self._balance

    @balance.setter
    def balance(self, balance: str) -> None:
        if balance not in DP_BALANCES:
            raise ValueError(f"balance must be one of {DP_BALANCES}, got {balance!r}")
        if balance == "prefix" and not self.events:
            raise ValueError("balance 'prefix' routes by the replicas' KV events: start them "
                             "with kv_events_config={'enable_kv_cache_events': True}")
        self._balance = balance

    def choose(self, request_id: str, token_ids: list[int], loads: list[int],
               lora_request=None) -> int:
        """The replica for this request, given each replica's load score now."""
        extra_keys = (lora_request.lora_int_id,) if lora_request else ()   # Request.extra_keys
        # Without events every index is empty: no prompt is hashed for nothing.
        hashes = block_hashes(token_ids, self.block_size, extra_keys) if self.events else []
        cached = [index.num_cached_blocks(hashes) for index in self.indexes]
        if self.balance == "round_robin":
            rank = next(self._cycle)
        elif self.balance == "score" or not hashes:
            rank = min(range(len(loads)), key=loads.__getitem__)
        else:
            rank = min(range(len(loads)),
                       key=lambda r: loads[r] - PREFIX_WEIGHT * cached[r] / len(hashes))
        self.choices.append(Choice(request_id, rank, cached[rank] * self.block_size))
        return rank

    def apply(self, rank: int, events) -> None:
        self.indexes[rank].apply(events)

    def clear(self) -> None:
        """Every replica's cache was emptied."""
        for index in self.indexes:
            index.hashes.clear()
