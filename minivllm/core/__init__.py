"""Scheduling and KV memory (vLLM twin: vllm/v1/core/). No tensors and no model here: every
file can be driven by a test with fake requests (tests/test_scheduler.py).

    scheduler.py       Scheduler.schedule() and update_from_output(); SchedulerOutput
    block_manager.py   paged KV blocks: allocate, append, fork (copy-on-write), free
    prefix_cache.py    automatic prefix caching: block hashes, LRU of free cached blocks
    kv_cache.py        KV bytes per token, the pool tensors, the contiguous baseline allocator
    request.py         Request: a request's state in the core (tokens, computed count, blocks)
"""
