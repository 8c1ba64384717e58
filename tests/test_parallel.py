"""Tensor parallelism (minivllm/distributed/) over gloo on this CPU: tp=2 (and tp=3 for
SmolLM2, whose 9 heads do not split in two) gives the tokens tp=1 gives, each rank holds 1/N of
the split layers and only its KV heads, and a dead worker makes the engine raise.

Starting a tp engine spawns processes that import torch and load a shard (seconds each), so the
tiny Llama engine is shared by the module, and each other engine starts once."""

from types import SimpleNamespace

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.config import HfConfig
from minivllm.models import LlamaForCausalLM
from minivllm.models.llama import projection_layers
from minivllm.distributed.layers import RowParallelLinear, parallelize, weight_bytes
from minivllm.distributed.parallel_state import check_tensor_parallel, kv_head_range

from conftest import PROMPTS, engine_config, reconfigured

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
SMALL = dict(max_model_len=256, num_kv_blocks=64)     # a 64-block pool, not 1 GiB per rank


def token_ids(llm, prompts, params=GREEDY):
    return [[o.token_ids for o in out.outputs]
            for out in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def tiny_llama_tp2(tiny_checkpoint):
    path, _ = tiny_checkpoint("llama")
    llm = LLM(str(path), tensor_parallel_size=2, **SMALL)
    yield path, llm
    llm.engine.shutdown()


def test_tp_size_that_does_not_split_the_heads_is_refused(smol_path):
    with pytest.raises(ValueError, match=r"9 attention heads.*sizes that work: \[1, 3\]"):
        LLM(str(smol_path), tensor_parallel_size=2)
    with pytest.raises(ValueError, match="tensor_parallel_size must be a positive integer"):
        LLM(str(smol_path), tensor_parallel_size=0)
    with pytest.raises(ValueError, match="compilation_config with tensor_parallel_size > 1"):
        LLM(str(smol_path), tensor_parallel_size=3, compilation_config=3)


@pytest.mark.parametrize("option", [
    {"quantization": "int8"}, {"enable_lora": True}, {"compilation_config": 3},
    {"speculative_config": {"num_speculative_tokens": 2}},
    {"kv_transfer_config": {"kv_role": "kv_producer"}}])
def test_options_tp_does_not_combine_with_are_refused_by_the_config(option):
    """One table (config.INCOMPATIBLE), checked when the VllmConfig is built: before any
    process starts, and at every reconfigure."""
    name = next(iter(option))
    with pytest.raises(ValueError, match=f"^{name} with tensor_parallel_size > 1 is not supported"):
        engine_config(tensor_parallel_size=2, **option)
    engine_config(tensor_parallel_size=1, **option)     # each is fine on its own


def test_layers_split_on_llama_3_70b_shapes():
    """The split itself, on the meta device (no memory): Llama-3-70B's 64 query and 8 KV
    heads over 8 ranks, and 16 ranks, where each KV head is held by the 2 ranks reading it."""
    config = HfConfig("LlamaForCausalLM", vocab_size=128256, hidden_size=8192,
                         intermediate_size=28672, num_hidden_layers=2, num_attention_heads=64,
                         num_key_value_heads=8, head_dim=128, max_position_embeddings=8192,
                         rms_norm_eps=1e-5, rope_theta=5e5)
    check_tensor_parallel(config, 8)
    assert [list(kv_head_range(config, r, 16)) for r in range(4)] == [[0], [0], [1], [1]]
    assert [list(kv_head_range(config, r, 4)) for r in (0, 3)] == [[0, 1], [6, 7]]
    for tp, kv_heads in ((8, 1), (16, 1)):
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
            local = parallelize(model, config, SimpleNamespace(rank=tp - 1, size=tp))
        attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
        assert (local.num_attention_heads, local.num_key_value_heads) == (64 // tp, kv_heads)
        assert attn.q_proj.weight.shape == (64 // tp * 128, 8192)
        assert attn.k_proj.weight.shape == (kv_heads * 128, 8192)
        assert isinstance(attn.o_proj, RowParallelLinear)
        assert attn.o_proj.weight.shape == (8192, 64 // tp * 128)
        assert mlp.down_proj.weight.shape == (8192, 28672 // tp)
        assert model.model.embed_tokens.weight.shape == (128256 // tp, 8192)
    with pytest.raises(ValueError, match="sizes that work"):
        check_tensor_parallel(config, 3)


def test_projection_layers_are_the_seven_linears_of_every_decoder_layer():
    """The one walk that TP sharding, quantization and LoRA share (models/llama.py)."""
    config = HfConfig("LlamaForCausalLM", vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-5,
                         rope_theta=1e4)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    linears = [n for n, m in model.named_modules()
               if type(m) is torch.nn.Linear and ".layers." in n]
    assert [p.path for p in projection_layers(model)] == linears and len(linears) == 3 * 7
    for p in projection_layers(model):                 # replaced as it goes, read when reached
        p.replace(torch.nn.Identity())
    assert all(type(p.linear) is torch.nn.Identity for p in projection_layers(model))


def test_tp2_greedy_matches_tp1_llama(tiny_llama_tp2):
    path, tp2 = tiny_llama_tp2
    tp1 = LLM(str(path), **SMALL)
    assert token_ids(tp2, PROMPTS[:4]) == token_ids(tp1, PROMPTS[:4])
    # A long prompt split into chunks of 8 tokens, beside decodes: mixed steps under tp too.
    with_chunks = dict(max_num_batched_tokens=8, max_num_seqs=4)
    expected = token_ids(tp1.reconfigure(**with_chunks), PROMPTS[2:6])
    assert token_ids(tp2.reconfigure(**with_chunks), PROMPTS[2:6]) == expected
    # Parallel sampling forks a prompt's blocks, and copy-on-write copies the shared last
    # block on every rank: the seeded samples match tp=1's.
    sampled = SamplingParams(n=3, temperature=0.8, seed=7, max_tokens=10)
    assert token_ids(tp2, PROMPTS[:2], sampled) == token_ids(tp1, PROMPTS[:2], sampled)


def test_tp2_swap_preemption_matches_tp1(tiny_llama_tp2):
    """A pool too small for 6 sequences: preempted sequences' blocks are swapped to host memory
    and back on every rank (reconfigure rebuilt every rank's pool first)."""
    path, tp2 = tiny_llama_tp2
    small = dict(SMALL, num_kv_blocks=20, block_size=4, preemption_mode="swap", max_num_seqs=6)
    prompts = [f"Tell me about number {i} and why it matters" for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    expected = token_ids(LLM(str(path), **small), prompts, params)
    with tp2.engine.trace() as steps:
        assert token_ids(tp2.reconfigure(**small), prompts, params) == expected
    assert sum(len(s.swapped_out) for s in steps) > 0
    tp2.reconfigure(**SMALL, block_size=16, preemption_mode="recompute", max_num_seqs=64,
                    max_num_batched_tokens=2048)


def test_each_rank_holds_its_share(tiny_llama_tp2):
    path, tp2 = tiny_llama_tp2
    runner = tp2.engine.runner
    full = weight_bytes(LLM(str(path), **SMALL).engine.runner.model)["total"]
    norms = 4 * (2 * 2 * 64 + 64)                # RMSNorm weights stay whole on every rank (fp32)
    rank_bytes = tp2.engine.model_executor.rank_weight_bytes
    assert [r["split"] for r in rank_bytes] == [(full - norms) // 2] * 2
    assert all(r["total"] == r["split"] + norms for r in rank_bytes)
    assert runner.kv_cache.shape[4] == 1      # 2 KV heads over 2 ranks: one each
    # Two all-reduces per layer, one for the embedding, one all-gather for the logits.
    before = runner.tp.num_all_reduce, runner.tp.num_all_gather
    tp2.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    steps = 3                                  # one prefill, two decodes
    assert runner.tp.num_all_reduce - before[0] == steps * (2 * 2 + 1)
    assert runner.tp.num_all_gather - before[1] == steps


def test_tp2_with_the_cpu_tier_matches_tp1(tiny_llama_tp2):
    """KV offloading under tensor parallelism: each rank keeps its KV heads' share of every
    block in a host pool of its own, at the same block ids. A 6-block pool preempts; the
    preempted requests load blocks back, and the tokens are tp=1's."""
    path, tp2 = tiny_llama_tp2
    starved = dict(max_model_len=256, num_kv_blocks=6, kv_offloading_size=0.001)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = token_ids(LLM(str(path), **starved), PROMPTS, params)
    with reconfigured(tp2, **starved):
        assert token_ids(tp2, PROMPTS, params) == expected
        assert tp2.engine.scheduler.num_preemptions > 0
        assert tp2.engine.scheduler.kv_connector.manager.num_loaded_blocks > 0


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_tp2_greedy_matches_tp1_qwen(tiny_checkpoint, arch):
    """Qwen2: q/k/v biases split with their rows. Qwen3: per-head q/k norms, tied lm_head."""
    path, _ = tiny_checkpoint(arch)
    expected = token_ids(LLM(str(path), **SMALL), PROMPTS[:3])
    tp2 = LLM(str(path), tensor_parallel_size=2, **SMALL)
    try:
        assert token_ids(tp2, PROMPTS[:3]) == expected
    finally:
        tp2.engine.shutdown()


def test_tp3_greedy_matches_tp1_on_smollm2(smol_llm, smol_path):
    """The default model: 9 query heads and 3 KV heads, one KV head per rank."""
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    expected = token_ids(smol_llm, PROMPTS[:2], params)
    tp3 = LLM(str(smol_path), tensor_parallel_size=3, max_model_len=256, num_kv_blocks=32)
    try:
        assert tp3.engine.runner.kv_cache.shape[4] == 1
        assert token_ids(tp3, PROMPTS[:2], params) == expected
    finally:
        tp3.engine.shutdown()


def test_dead_worker_makes_the_engine_raise(tiny_llama_tp2):
    """Last in the module: it kills the shared engine's worker."""
    _, tp2 = tiny_llama_tp2
    worker = tp2.engine.model_executor.workers[0]
    worker.kill()
    worker.join(timeout=10)
    with pytest.raises(RuntimeError, match=r"worker\(s\) died: minivllm-rank1 .*exit code -9"):
        tp2.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
    with pytest.raises(RuntimeError, match="died"):   # and stays broken, it does not hang
        tp2.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
