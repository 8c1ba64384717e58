"""Less Python per decode step: torch.compile around attention, and CUDA graphs for decode.

A decode step of SmolLM2 runs ~30 layers x ~25 small ops. At batch 1 each op does little math,
so on a GPU the step is bound by launching kernels (a few us each, from Python) rather than by
the GPU itself. Two remedies, as in vLLM:

  * torch.compile (`compilation_config=3`): the model's whole forward (embedding, 30 layers,
    final norm) is traced by Dynamo and compiled by Inductor with a dynamic token count, except
    attention, which stays one opaque op (`minivllm::unified_attention`, attention/layer.py,
    vLLM's splitting op): its batch layout is Python that changes every step, so it reads the
    step's metadata from the forward context instead of taking it as a graph input. Around it
    the elementwise ops fuse (each RMSNorm into one loop, the residual adds, rotary, SiLU x up,
    the dtype conversions around quantized matmuls), and the graph calls the matmuls itself:
    no Python between ops. Torch compiles one graph for a single token (batch-1 decode) and
    one for every other count, with the weights as inputs rather than constants.
  * CUDA graphs (on unless `enforce_eager=True`; CUDA, Triton attention, tp=1; refused with
    LoRA, whose per-token adapter slots a replay would not see): the whole
    decode forward is captured once per batch-size bucket (1, 2, 4, 8, 16, 32, ... up to
    max_num_seqs) and each decode step is one `replay()`: one launch instead of hundreds.
    A graph replays fixed addresses and shapes, so the step's inputs are copied into static
    buffers, a batch is padded up to its bucket (padded tokens write their K/V to slot -1,
    which the write kernel skips), and the paged decode kernel gets a fixed partition count
    (max_model_len) and its fixed DecodeScratch. Prefill and mixed steps run eagerly.

Left out, compared with vLLM: splitting the graph at attention for piecewise CUDA graphs of
prefill, Inductor's own graph pass pipeline (fusing the all-reduce, the residual add and the
norm), graphs under tensor parallelism, and capture-size lists or cache directories set by the
user; and compiling with LoRA (its per-step adapter layout is Python a graph would guard on).
"""

from __future__ import annotations

import torch

from minivllm.attention.metadata import AttentionMetadata
from minivllm.config import CUDA_GRAPHS, incompatibility


def use_cuda_graphs(vllm_config, device: torch.device, tp, attention_backend: str) -> bool:
    """Whether decode steps replay CUDA graphs (CUDA, Triton attention, tp=1 and pp=1, not
    enforce_eager); with LoRA on, the INCOMPATIBLE row's error instead: the graphs would
    replay the base path only (LoRA's slots are Python state a replay never reads)."""
    split = tp is not None or vllm_config.parallel_config.pipeline_parallel_size > 1
    if device.type != "cuda" or vllm_config.model_config.enforce_eager or split \
            or attention_backend != "triton":
        return False
    if vllm_config.lora_config is not None:
        raise ValueError(incompatibility(CUDA_GRAPHS, "enable_lora"))
    return True


def set_compilation(model: torch.nn.Module, level: int) -> bool:
    """level 3: compile the model's forward (model.model, the part below the LM head) in place;
    level 0: back to eager. Returns whether it is compiled now."""
    body = model.model
    if level:
        # Dynamo keeps its graphs per code object, for every model this process ever traced
        # (all of LlamaModel.forward's, 3 or so a model), and falls back to eager past 8: a
        # new engine starts from none. (Another compiled engine in this process recompiles.)
        torch._dynamo.reset()
        body.compile(dynamic=True)
    else:
        body._compiled_call_impl = None           # what nn.Module.compile sets
    return bool(level)


def capture_sizes(max_num_seqs: int) -> list[int]:
    """The decode batch sizes that get a graph: powers of two below max_num_seqs, and it."""
    sizes = [1 << i for i in range(max_num_seqs.bit_length()) if 1 << i < max_num_seqs]
    return sizes + [max_num_seqs]


class CUDAGraphRunner:
    """One captured decode forward per batch-size bucket, over static input buffers."""

    def __init__(self, model: torch.nn.Module, max_num_seqs: int, max_model_len: int,
                 block_size: int, decode_scratch, device: torch.device):
        self.model = model
        self.sizes = capture_sizes(max_num_seqs)
        n = self.sizes[-1]
        blocks = -(-max_model_len // block_size)
        i64 = dict(dtype=torch.int64, device=device)
        self.input_ids = torch.zeros(n, **i64)
        self.positions = torch.zeros(n, **i64)
        self.slot_mapping = torch.full((n,), -1, **i64)          # -1: padding, never written
        self.seq_lens = torch.ones(n, **i64)
        self.block_tables = torch.zeros(n, blocks, **i64)
        self.query_start_loc = torch.arange(n + 1, **i64)         # one token per sequence
        self.graphs = {}
        self.outputs = {}
        self.replays: dict[int, int] = {}     # bucket -> decode steps replayed (lessons, tests)
        pool = None
        for bs in reversed(self.sizes):       # largest first: the smaller ones share its pool
            # max_seq_len is max_model_len, always: the decode kernel's grid must not change.
            md = AttentionMetadata(self.slot_mapping[:bs], self.query_start_loc[:bs + 1],
                                   self.seq_lens[:bs], self.block_tables[:bs], max_query_len=1,
                                   max_seq_len=max_model_len, decode_scratch=decode_scratch)
            self.model(self.input_ids[:bs], self.positions[:bs], md)   # warm up: JIT, allocator
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs] = self.model(self.input_ids[:bs], self.positions[:bs], md)
            pool = graph.pool()
            self.graphs[bs] = graph

    def can_run(self, input_ids: torch.Tensor, md: AttentionMetadata) -> bool:
        return md.max_query_len == 1 and input_ids.shape[0] <= self.sizes[-1]

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            md: AttentionMetadata) -> torch.Tensor:
        """One decode step: copy its inputs into the static buffers, replay, (n, hidden)."""
        n = input_ids.shape[0]
        bs = next(size for size in self.sizes if size >= n)        # pad up to the bucket
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(md.slot_mapping)
        self.slot_mapping[n:bs].fill_(-1)                          # padding writes nothing
        self.seq_lens[:n].copy_(md.seq_lens)
        self.seq_lens[n:bs].fill_(1)
        self.block_tables[:n, :md.block_tables.shape[1]].copy_(md.block_tables)
        self.graphs[bs].replay()
        self.replays[bs] = self.replays.get(bs, 0) + 1
        return self.outputs[bs][:n]
