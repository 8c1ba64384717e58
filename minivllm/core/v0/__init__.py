"""vLLM V0's mechanisms, kept beside V1's for lessons 02, 04 and 11 (config: scheduler_cls =
V0_SCHEDULER; swap preemption and static batching pick it).

    scheduler.py    V0Scheduler: V1's Scheduler (core/scheduler.py) with V0's steps
                    overridden: n > 1 samples forked after one prefill, sharing its blocks
                    (copy-on-write), swap preemption to a host-memory pool, a third queue
                    (`swapped`), and static batching
    beam_group.py   BeamGroup: beam search inside the core, its beams forked the same way

Every sample the V0 scheduler makes is a request of its own, with its own id (V1's child
format, "{index}_{id}"), so the runner, the sampler and every message see V1's one key: a
fork is the scheduler's act alone, and the runner meets a forked sample as a new request whose
computed tokens came with shared blocks, as a prefix-cache hit does.
"""
