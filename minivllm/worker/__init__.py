"""Running the model (vLLM twin: vllm/v1/worker/).

    model_runner.py   flat batch -> input_ids, positions, slot_mapping, block_tables -> forward
                      -> sampled tokens; owns the model and the KV pool
    compilation.py    torch.compile around attention, CUDA graphs for decode
"""
