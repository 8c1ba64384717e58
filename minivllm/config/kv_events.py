"""KV cache events for a router (vLLM twin: vllm/config/kv_events.py)."""

from __future__ import annotations

from dataclasses import dataclass

from minivllm.config.utils import check_bools, check_keys


@dataclass(slots=True, frozen=True)
class KVEventsConfig:
    """vLLM's `kv_events_config` dict. With enable_kv_cache_events, each engine core records
    what its prefix cache names and forgets (minivllm/core/kv_events.py) and sends it with its
    outputs, where the data-parallel front end's prefix-aware routing reads it
    (minivllm/routing.py). Left out: vLLM's publisher, endpoint and topic (a ZMQ socket for
    routers outside the engine)."""

    enable_kv_cache_events: bool = False

    @classmethod
    def from_dict(cls, d: dict) -> KVEventsConfig:
        return cls(**check_keys(cls, "kv_events_config", d, "enable_kv_cache_events", ""))

    def __post_init__(self):
        check_bools(self, "enable_kv_cache_events")
