"""GPU tests: the Triton kernels compiled for the GPU at real sizes in bf16, and the engine on
CUDA with its default backend. Marked `gpu` and skipped without CUDA; scripts/gpu_check.sh runs
them with the benchmark. They need no packaged model and no network (random weights)."""

import gc

import pytest
import torch

from kernels.flash_attention import flash_attention, flash_attention_reference
from kernels.paged_attention import paged_decode_attention, paged_decode_reference
from kernels.paged_batch import random_paged_batch
from kernels import write_kv as write_kv_module

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
BF16 = torch.bfloat16


def test_write_kv_bf16():
    write_kv_module.test_write_kv("cuda", BF16)


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(32, 8, 128), (16, 8, 128), (9, 3, 64),
                                                     (32, 32, 128), (32, 1, 128), (18, 2, 64)])
def test_flash_attention_real_sizes_bf16(heads, kv_heads, head_dim):
    """A 2k-token prompt, a 512-token chunk over 1.5k cached tokens, two decodes, one batch."""
    b = random_paged_batch([2048, 512, 1, 1], [0, 1536, 3000, 100], heads, kv_heads, head_dim,
                           dtype=BF16, device="cuda")
    args = (b.q, b.k_cache, b.v_cache, b.query_start_loc, b.seq_lens, b.block_tables)
    out = flash_attention(*args, b.max_query_len, head_dim ** -0.5)
    ref = flash_attention_reference(*args, head_dim ** -0.5)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(32, 8, 128), (16, 8, 128), (9, 3, 64),
                                                     (32, 1, 128)])
def test_paged_decode_real_sizes_bf16(heads, kv_heads, head_dim):
    """64 sequences, contexts from 1 to 4k tokens (one to eight 512-token partitions)."""
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, 4096, (64,), generator=g).tolist()
    ctx[:3] = [0, 511, 512]
    b = random_paged_batch([1] * 64, ctx, heads, kv_heads, head_dim, dtype=BF16, device="cuda")
    args = (b.q, b.k_cache, b.v_cache, b.seq_lens, b.block_tables)
    out = paged_decode_attention(*args, b.max_seq_len, head_dim ** -0.5)
    ref = paged_decode_reference(*args, head_dim ** -0.5)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


TINY = dict(model_type="llama", hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=2, head_dim=64, vocab_size=1000,
            max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=1e4,
            tie_word_embeddings=False)


def _free():
    """Return an engine's KV pool to the GPU before the next one sizes its own."""
    gc.collect()
    torch.cuda.empty_cache()


@pytest.fixture(scope="module")
def tiny_gpu_checkpoint(tmp_path_factory):
    from minivllm.benchmarks.gpu import random_checkpoint
    path = tmp_path_factory.mktemp("tiny-gpu")
    random_checkpoint(TINY, path, dtype=torch.float32, device="cuda", std=0.08)
    _free()
    return path


def _agree_until_a_near_tie(ours, ref, tie: float) -> int:
    """Greedy tokens must match step by step until the reference's top two logprobs are within
    `tie` (a near-tie that rounding may legitimately flip); returns the steps compared."""
    for i, (a, b) in enumerate(zip(ours.token_ids, ref.token_ids)):
        assert a == b, f"step {i}: {a} != {b} with top-2 logprobs {ref.logprobs[i]}"
        top = sorted(ref.logprobs[i].values(), reverse=True)
        if len(top) > 1 and top[0] - top[1] < tie:
            return i + 1
    return len(ref.token_ids)


def test_engine_on_cuda_defaults_to_triton_and_matches_torch(tiny_gpu_checkpoint):
    """bf16 on CUDA picks the kernels. In fp32 both backends give the same greedy tokens,
    through chunked prefill, mixed batches and split decodes, up to the first near-tie: the
    kernels' fp32 dots are TF32 (kernels/flash_attention.py), which moves attention outputs by
    ~1e-3, so a top-2 gap under 0.05 nats may flip and is where the comparison stops."""
    from minivllm import LLM, SamplingParams
    path = str(tiny_gpu_checkpoint)
    default = LLM(path, max_model_len=1024, gpu_memory_utilization=0.3)
    assert "attention=triton" in repr(default) and "dtype=bfloat16" in repr(default)
    del default
    _free()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 1000, (n,), generator=g).tolist() for n in (5, 100, 700)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=2)
    outs = {}
    for backend in ("torch", "triton"):
        llm = LLM(path, dtype="float32", max_model_len=1024, max_num_batched_tokens=256,
                  gpu_memory_utilization=0.3, attention_backend=backend)
        outs[backend] = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        del llm
        _free()
    compared = [_agree_until_a_near_tie(a, b, tie=0.05)
                for a, b in zip(outs["triton"], outs["torch"])]
    assert sum(compared) >= 30, compared     # the test must compare something


# Thresholds of the bf16 test, from a measured distribution (a CPU stand-in: no GPU has run
# this yet). This tiny random model in bf16 against itself in fp32 (torch backend, 4 prompts x
# 300 positions): cosine min 0.9944 (1st percentile 0.9964, median 0.9989), argmax agreement
# 91% (random weights have many near-ties: 2/3 of the rows have a top-2 margin under twice
# bf16's error), 100% on rows whose margin exceeds twice the error. The old thresholds (cosine
# > 0.999 and argmax agreement > 0.95 between the two bf16 backends) sat inside that noise. So
# both bf16 backends are measured against the fp32 reference, and the kernels must add no more
# than bf16 itself does: mean error within 1.5x of the torch backend's, cosine above 0.99, and
# every decisive row (margin > twice either backend's error) agreeing.
def test_engine_bf16_logits_as_close_to_fp32_as_torch_bf16(tiny_gpu_checkpoint):
    from minivllm import LLM
    ids = torch.randint(3, 1000, (300,), generator=torch.Generator().manual_seed(2)).tolist()
    logits = {}
    for dtype, backend in (("float32", "torch"), ("bfloat16", "torch"), ("bfloat16", "triton")):
        llm = LLM(str(tiny_gpu_checkpoint), dtype=dtype, max_model_len=1024,
                  gpu_memory_utilization=0.3, attention_backend=backend)
        # To the host: a tensor kept on the GPU may sit in the tail of the engine's KV pool
        # segment (the caching allocator splits the 2 MiB rounding off the pool's cudaMalloc),
        # and would keep the whole segment from empty_cache: seen on an H200.
        logits[dtype, backend] = llm.engine.prompt_logits(ids).float().cpu()
        del llm
        _free()
    ref = logits["float32", "torch"]
    ours, theirs = logits["bfloat16", "triton"], logits["bfloat16", "torch"]
    cos = torch.nn.functional.cosine_similarity(ours, ref, dim=-1)
    assert cos.min() > 0.99, cos.min()
    assert (ours - ref).abs().mean() < 1.5 * (theirs - ref).abs().mean()
    err = torch.maximum((ours - ref).abs().amax(-1), (theirs - ref).abs().amax(-1))
    top2 = ref.topk(2, -1).values
    decisive = top2[:, 0] - top2[:, 1] > 2 * err
    assert decisive.sum() >= 30, int(decisive.sum())
    assert torch.equal(ours.argmax(-1)[decisive], ref.argmax(-1)[decisive])
