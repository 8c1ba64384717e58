"""More than one process (vLLM twin: vllm/distributed/): torch.distributed, no RPC of our own.

    parallel_state.py   the process groups (tensor, pipeline) and their collectives; which tp
                        sizes a model allows, and which KV heads each rank holds
    layers.py           the tensor-parallel layers (column/row-parallel linear, vocab-parallel
                        embedding and LM head) and `parallelize`, which swaps them into a model
    pipeline.py         pipeline parallelism: which layers a stage holds (get_pp_indices) and
                        `split_for_stage`, which drops the rest from a model
    kv_transfer/        prefill/decode disaggregation: the KV connector (its scheduler and
                        worker sides) and its transport
"""
