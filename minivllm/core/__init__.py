"""Scheduling and KV memory (vLLM twin: vllm/v1/core/). No tensors and no model here: every
file can be driven by a test with fake requests (tests/test_scheduler.py).

    scheduler.py       V1's Scheduler: schedule() and update_from_output()
    scheduler_output.py  SchedulerOutput: the step's messages to the runner, by request id
    block_manager.py   paged KV blocks: allocate, append (copy-on-write), free
    prefix_cache.py    automatic prefix caching: block hashes, LRU of free cached blocks
    kv_cache.py        KV bytes per token, the pool tensors, the contiguous baseline allocator
    request.py         Request: a request's state in the core (tokens, computed count, blocks)
    v0/                vLLM V0's mechanisms beside V1's: a scheduler that forks samples and
                       beams in the core, swaps, and batches statically (lessons 02, 04, 11)
"""
