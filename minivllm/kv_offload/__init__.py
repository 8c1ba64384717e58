"""KV offloading: a CPU tier under the prefix cache (vLLM twin: vllm/v1/kv_offload/ and the
OffloadingConnector, vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py).

The GPU pool is small next to host memory. With `kv_offloading_size` GiB of host memory (the
flag --kv-offloading-size, vLLM's name and unit), every full block a step computes is also
stored in a CPU tier, keyed by the block hash the prefix cache names it by, and it stays there
after the GPU pool evicts it (least recently used goes first when the tier is full). A request
admitted later matches its prefix in two tiers: the GPU pool first, then the CPU tier, whose
hits are loaded into the blocks just allocated for it instead of computed again. A request
preempted by recompute finds its own blocks there when it comes back: V1's answer to V0's swap.

As vLLM's connector, it has two sides that share only the metadata a SchedulerOutput carries:

    manager.py      CPUOffloadingManager: the tier's table (hash -> host block, LRU), no tensor
    connector.py    OffloadingConnectorScheduler, in the core beside the Scheduler: after a
                    request is allocated, the tier's hits past its GPU hits become loads; after
                    each step is scheduled, the full blocks it will compute become stores.
                    OffloadingConnectorWorker, in the Worker: the host pool, the loads copied
                    in before the forward and the stores copied out after it.
"""
