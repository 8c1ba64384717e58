"""torch.compile (compilation_config=3) and CUDA graphs for decode (minivllm/worker/compilation.py).

Compiling runs Inductor once (C++ on this CPU: ~20 s idle), so one tiny checkpoint is compiled
once. The graph tests need CUDA and are skipped here; they run on random weights of SmolLM2's
shapes, so a rented GPU without the packaged model runs them too (scripts/gpu_check.sh)."""

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.worker.compilation import capture_sizes

from conftest import PROMPTS, engine_config, gpu

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
SMOLLM2_SHAPE = dict(model_type="llama", hidden_size=576, intermediate_size=1536,
                     num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                     vocab_size=49152, max_position_embeddings=2048, rms_norm_eps=1e-5,
                     rope_theta=1e5, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def gpu_checkpoint(tmp_path_factory):
    """SmolLM2-135M's shapes, random bf16 weights (a spread that keeps outputs varied), and
    eight random prompts of 5 to 40 token ids."""
    from minivllm.benchmarks.gpu import random_checkpoint
    path = tmp_path_factory.mktemp("smollm2-shape")
    random_checkpoint(SMOLLM2_SHAPE, path, device="cuda", std=0.05)
    torch.cuda.empty_cache()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 1000, (int(n),), generator=g).tolist()
               for n in torch.randint(5, 40, (8,), generator=g)]
    return path, prompts


def test_capture_sizes():
    assert capture_sizes(1) == [1]
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert capture_sizes(48) == [1, 2, 4, 8, 16, 32, 48]


def test_compilation_config_is_checked(tiny_checkpoint):
    path, _ = tiny_checkpoint("llama")
    with pytest.raises(ValueError, match=r"level must be 0 \(eager\) or 3"):
        LLM(str(path), compilation_config=2)
    with pytest.raises(ValueError, match="unknown key"):
        LLM(str(path), compilation_config={"level": 3, "backend": "eager"})


def test_compiled_model_matches_eager(tiny_checkpoint):
    path, _ = tiny_checkpoint("llama")
    llm = LLM(str(path), max_model_len=256, num_kv_blocks=64)
    ids = llm.tokenizer.encode(PROMPTS[2])
    eager_logits = llm.engine.prompt_logits(ids)
    tokens = lambda prompts: [o.outputs[0].token_ids  # noqa: E731
                              for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    eager, eager_alone, later = tokens(PROMPTS[:4]), tokens(PROMPTS[4:5]), tokens(PROMPTS[5:8])
    llm.reconfigure(compilation_config={"level": 3})
    assert llm.engine.runner.compiled
    torch.testing.assert_close(llm.engine.prompt_logits(ids), eager_logits, rtol=1e-4,
                               atol=1e-4)
    assert tokens(PROMPTS[:4]) == eager and tokens(PROMPTS[4:5]) == eager_alone
    # Both graphs exist now (one token; any other count). Other prompt lengths, batches and
    # context lengths must not compile again: the step's metadata reaches attention through
    # the forward context, not the graph, so a grown sequence changes no guard.
    torch.compiler.set_stance("fail_on_recompile")
    try:
        assert tokens(PROMPTS[5:8]) == later
    finally:
        torch.compiler.set_stance("default")
    llm.reconfigure(compilation_config=0)
    assert not llm.engine.runner.compiled


def test_compiled_graph_holds_every_op_but_attention(tiny_checkpoint):
    """Dynamo traces the whole forward as one graph: attention appears in it as the opaque op
    `minivllm::unified_attention`, once a layer, and nothing breaks the graph."""
    path, _ = tiny_checkpoint("llama")
    llm = LLM(str(path), max_model_len=256, num_kv_blocks=64)
    model = llm.engine.runner.model
    body = model.model
    graphs = []

    def backend(gm, example_inputs):       # keep the traced graph, run it as traced
        graphs.append(gm)
        return gm.forward

    model.model = torch.compile(body, backend=backend, dynamic=True, fullgraph=True)
    try:                       # fullgraph: a graph break would raise here
        llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
    finally:
        model.model = body
    assert graphs
    ops = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    attention = [op for op in ops if "unified_attention" in op]
    assert len(attention) == llm.engine.model_config.hf_config.num_hidden_layers
    assert len(ops) > 10 * len(attention)     # norms, projections, rotary, MLP: all in it


def test_lora_with_compilation_is_refused():
    with pytest.raises(ValueError, match="^enable_lora with compilation_config is not"):
        engine_config(enable_lora=True, compilation_config=3)


@gpu
def test_cuda_graphs_decode_matches_eager(gpu_checkpoint):
    """A batch of 8 replays the 8 graph with no padding: the same kernels on the same shapes
    as eager, so the same tokens. A batch of 5 pads up to 8 (its matmuls then run at 8 rows,
    where cuBLAS may pick other kernels: bf16 rounding may differ, so only its count is
    checked)."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    path, prompts = gpu_checkpoint
    graphs = LLM(str(path), device="cuda", max_model_len=512, max_num_seqs=8,
                 gpu_memory_utilization=0.3)
    runner = graphs.engine.runner
    assert sorted(runner.cuda_graphs.graphs) == [1, 2, 4, 8]
    got = [o.outputs[0].token_ids for o in graphs.generate(prompts, params, use_tqdm=False)]
    assert runner.cuda_graphs.replays == {8: 23}          # every decode step was a replay
    graphs.generate(prompts[:5], params, use_tqdm=False)
    assert runner.cuda_graphs.replays == {8: 46}          # 5 sequences padded up to 8
    graphs.reconfigure(enforce_eager=True)
    assert graphs.engine.runner.cuda_graphs is None
    eager = [o.outputs[0].token_ids for o in graphs.generate(prompts, params, use_tqdm=False)]
    assert got == eager


@gpu
def test_cuda_graphs_off_for_torch_attention(gpu_checkpoint):
    llm = LLM(str(gpu_checkpoint[0]), device="cuda", dtype="float32", max_model_len=256,
              max_num_seqs=4, gpu_memory_utilization=0.3)
    assert llm.engine.runner.attention_backend == "torch"
    assert llm.engine.runner.cuda_graphs is None       # its gather needs host-side sizes


def test_lora_with_cuda_graphs_is_refused():
    """A decode graph replays the base path it was captured with (LoRA's per-token slots are
    Python state a replay never reads), so LoRA under graphs would be ignored after the first
    token: refused with config.INCOMPATIBLE's message, on CUDA only, unless enforce_eager."""
    from minivllm.worker.compilation import use_cuda_graphs
    cuda = torch.device("cuda")          # a device object only: nothing runs on it
    with pytest.raises(ValueError, match="enable_lora with CUDA graphs is not supported.*"
                                         "enforce_eager=True"):
        use_cuda_graphs(engine_config(enable_lora=True), cuda, None, "triton")
    assert use_cuda_graphs(engine_config(enable_lora=True, enforce_eager=True), cuda, None,
                           "triton") is False
    assert use_cuda_graphs(engine_config(enable_lora=True), torch.device("cpu"), None,
                           "triton") is False
    assert use_cuda_graphs(engine_config(), cuda, None, "triton") is True
