"""ModelRunner: owns the model and the KV pool, and turns a scheduled batch into sampled tokens
(vLLM twin: vllm/v1/worker/gpu_model_runner.py).

`execute_model(scheduler_output)` is one step's work on the device:

    0. state          its own state of each request (worker/input_batch.py) brought up to date
                      from the scheduler's messages (it reads no scheduler object)
    1. block copies   copy-on-write (the Worker moves blocks to and from host memory)
    2. prepare        flatten the scheduled requests into the four tensors every paged engine
                      builds:
                        input_ids     (T,)   the new tokens of every request, concatenated
                        positions     (T,)   each token's position in its own request (RoPE)
                        slot_mapping  (T,)   where each new token's K/V goes in the pool
                        block_tables  (B, max_blocks)   where each request's earlier K/V is
    3. forward        the model once, and logits only for the last token of each request that
                      samples (k + 1 rows for a request verifying k draft tokens)
    4. sample         the Sampler draws each row; the rejection sampler keeps the accepted
                      drafts; the drafter (minivllm/spec_decode/) proposes the next step's

and returns a ModelRunnerOutput (minivllm/outputs.py) for Scheduler.update_from_output, with
each phase's seconds (worker/phase_timer.py). Under async scheduling (core/async_scheduler.py)
the runner appends its own samples to its state: the core schedules the next step before it
has them, and the runner reads the new tokens' ids from there (V1 keeps them on the device).

The weights are loaded once. The Worker (worker/worker.py) then sets what a configuration owns,
one method a thing: the weights' format (`set_weight_format`), the per-configuration state
(`configure`), the pool (`initialize_kv_cache`, once the worker has sized it) and compilation
(`compile_or_warm_up_model`), so LLMEngine.reconfigure rebuilds them over the same weights.

Split across processes (minivllm/distributed/), every rank holds a ModelRunner over its shard
of the weights (tensor parallelism) of its stage's layers (pipeline parallelism), and runs the
same execute_model on the same messages (minivllm/executor/); collectives and the stages'
sends keep them in step, and only the driver (tensor rank 0 of the last stage) samples.
Decode steps on CUDA replay CUDA graphs; torch.compile is an option (worker/compilation.py).

Left out, compared with vLLM: the persistent InputBatch, multi-modal inputs.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from minivllm.attention.layer import resolve_attention_backend
from minivllm.attention.metadata import AttentionMetadata
from minivllm.config import HfConfig, ModelConfig, VllmConfig
from minivllm.core.kv_cache import kv_bytes_per_token
from minivllm.core.scheduler_output import SchedulerOutput
from minivllm.distributed.layers import parallelize
from minivllm.distributed.pipeline import split_for_stage
from minivllm.lora.models import LoRAManager
from minivllm.models import LlamaForCausalLM
from minivllm.models.llama import PPMissingLayer
from minivllm.models.loader import load_weights
from minivllm.outputs import ModelRunnerOutput
from minivllm.quantization.weight_only import quantize_model, unquantize_model
from minivllm.sample.rejection_sampler import accept_drafts
from minivllm.sample.sampler import Sampler
from minivllm.sampling_params import SamplingParams
from minivllm.worker.compilation import CUDAGraphRunner, set_compilation, use_cuda_graphs
from minivllm.worker.input_batch import CachedRequestState, StepInputs
from minivllm.worker.phase_timer import PhaseTimer

logger = logging.getLogger("minivllm")


def allocate_kv_cache(config: HfConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: torch.device, kv_cache_dtype: str = "auto",
                      pin_memory: bool = False) -> torch.Tensor:
    """The KV pool: [layers, 2 (K, V), num_blocks, block_size, kv_heads, head_dim] (vLLM: the
    runner's initialize_kv_cache; the core only counts blocks). Zero-filled, not empty:
    attention masks unused slots, but a masked NaN would still poison the weighted sum of V
    (0 x NaN = NaN). Quantized ("fp8", "int8"): int8 storage, each row head_dim bytes then its
    fp32 scale's 4 bytes (kernels/write_kv.py), so copy-on-write and swaps move the scales.
    pin_memory: a pool in host memory that copies to and from CUDA can overlap."""
    row, dtype = ((config.head_dim, dtype) if kv_cache_dtype == "auto"
                  else (config.head_dim + 4, torch.int8))
    return torch.zeros(config.num_hidden_layers, 2, num_blocks, block_size,
                       config.num_key_value_heads, row, dtype=dtype, device=device,
                       pin_memory=pin_memory)


def copy_blocks(pairs: list[tuple[int, int]], src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst's block b becomes a copy of src's block a, for each (a, b), in every layer: within
    the device pool (copy-on-write), or between it and a pool in host memory."""
    if pairs:
        src_blocks, dst_blocks = map(list, zip(*pairs))
        dst[:, :, dst_blocks] = src[:, :, src_blocks].to(dst.device)


class ModelRunner:
    def __init__(self, vllm_config: VllmConfig, device: torch.device, tp=None,
                 sampler: Sampler | None = None, pp=None):
        """Build the model and load its weights (this rank's shard of its stage's layers when
        split); the Worker then configures it and gives it a pool. sampler: the engine's (it
        knows the EOS tokens); a runner that never samples
        (a rank but the driver, the draft model) needs none."""
        model_config = vllm_config.model_config
        self.hf_config = model_config.hf_config      # the checkpoint's shape
        self.device = device                         # this rank's
        self.dtype = dtype = model_config.dtype
        # Split: tp, pp its TensorParallelGroup, PipelineParallelGroup (None: not split). The
        # KV pool holds its KV heads of its stage's layers only: sized from kv_config.
        self.tp, self.pp = tp, pp
        self.tp_size, self.pp_size = (tp.size if tp else 1), (pp.size if pp else 1)
        # The rank whose samples count: tensor rank 0 of the last stage (vLLM's output rank).
        self.is_driver = (tp is None or tp.rank == 0) and (pp is None or pp.is_last)
        self.kv_config = self.hf_config
        # Before the model is built: building it may import Triton (through torch), and on a CPU
        # Triton must see TRITON_INTERPRET=1 before that (see minivllm/platforms.py).
        resolve_attention_backend(model_config.attention_backend, device, dtype)
        with torch.device("meta"):          # no time wasted on random init of real weights
            model = LlamaForCausalLM(self.hf_config)
            if tp is not None:
                self.kv_config = parallelize(model, self.hf_config, tp)
            if pp is not None:
                self.kv_config = split_for_stage(model, self.hf_config, pp.stage, pp.size,
                                                 self.kv_config)
        model = model.to_empty(device=device).to(dtype)    # this breaks a tie: restore it
        if self.hf_config.tie_word_embeddings and not isinstance(model.lm_head, PPMissingLayer):
            model.lm_head.weight = model.model.embed_tokens.weight
        self.path = Path(model_config.model)   # read again to leave a quantized format
        load_weights(model, self.path)
        self.model = model.eval()
        self.sampler = sampler if sampler is not None else Sampler(device)
        self.quantization = None, True       # the weights' format: (quantization, lm head too)
        # The state, all of it, made here; what one configuration owns is set again by
        # configure, initialize_kv_cache (the pool) and compile_or_warm_up_model (graphs).
        self.vllm_config: VllmConfig | None = None
        self.attention_backend = self.lora_manager = self.decode_scratch = None
        self.requests: dict[str, CachedRequestState] = {}    # request id -> the runner's state
        self.inputs = StepInputs(device)                     # the step's input buffers
        self.kv_layout, self.kv_cache_dtype = "paged", "auto"
        self.block_size = self.block_bytes = self.num_blocks = 0
        self.kv_cache: torch.Tensor | None = None            # the pool
        self.drafter = None                # speculative decoding's, set with the pool (Worker)
        self.compiled, self.cuda_graphs = False, None

    def set_weight_format(self, model_config: ModelConfig) -> None:
        """Quantize the weights as asked, or go back to float (reading the checkpoint again
        when the float weights were dropped). LoRA's wrappers come off first."""
        if self.lora_manager:                # plain nn.Linear back first: LoRA is rebuilt later
            self.lora_manager.unwrap()
            self.lora_manager = None
        asked = model_config.quantization, model_config.quantize_lm_head   # weights' format
        if asked != self.quantization:
            if unquantize_model(self.model):   # the float weights were dropped: read them again
                load_weights(self.model, self.path)
            self.quantization = None, True       # float now, should quantize_model refuse
            quantize_model(self.model, *asked)   # (minivllm/quantization/weight_only.py)
            self.quantization = asked

    def configure(self, vllm_config: VllmConfig) -> None:
        """The state one configuration owns, but the pool: no sample's state outlives it; the
        attention backend, LoRA's slots, the Triton decode scratch and the RoPE tables."""
        self.vllm_config = vllm_config
        max_model_len = vllm_config.model_config.max_model_len
        cache_config = vllm_config.cache_config
        self.sampler.reset()                 # no sample's generator outlives its pool
        self.requests = {}
        self.inputs = StepInputs(self.device)
        self.drafter = self.cuda_graphs = None
        self.kv_cache = self.decode_scratch = None   # old buffers go first
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.attention_backend = resolve_attention_backend(
            vllm_config.model_config.attention_backend, self.device, self.dtype)
        # LoRA slots (minivllm/lora/models.py), before KV sizing
        self.lora_manager = (LoRAManager(self.model, vllm_config.lora_config, self.device)
                             if vllm_config.lora_config else None)
        # The Triton decode kernel's partial results: one fixed buffer for the engine's largest
        # decode batch (max_num_seqs sequences of max_model_len tokens), before the KV pool
        # takes what memory is left.
        if self.attention_backend == "triton":
            from minivllm.attention.triton_attention import DecodeScratch
            self.decode_scratch = DecodeScratch.allocate(
                vllm_config.scheduler_config.max_num_seqs, self.kv_config.num_attention_heads,
                self.kv_config.head_dim, max_model_len, self.device)
        self.model.model.rotary_emb.build(max_model_len, self.device, self.dtype)
        # "paged": blocks of block_size tokens; "contiguous": one slab of max_model_len tokens
        # per sequence (lesson 01's baseline), addressed the same way.
        self.kv_layout = cache_config.kv_layout
        self.block_size = cache_config.block_size if self.kv_layout == "paged" else max_model_len
        self.kv_cache_dtype = cache_config.cache_dtype
        self.block_bytes = (kv_bytes_per_token(self.kv_config, self.dtype, self.kv_cache_dtype)
                            * self.block_size)

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """Allocate the KV pool of num_blocks blocks."""
        self.num_blocks = num_blocks
        self.kv_cache = allocate_kv_cache(self.kv_config, num_blocks, self.block_size,
                                          self.dtype, self.device, self.kv_cache_dtype)
        self.bind_kv_cache(self.kv_cache)
        logger.info("KV pool: %d blocks x %d tokens = %d tokens, %.1f MiB (%s)",
                    num_blocks, self.block_size, num_blocks * self.block_size,
                    self.kv_cache.numel() * self.kv_cache.element_size() / 2**20, self.kv_layout)

    @torch.inference_mode()    # as every forward (traced with autograd, attention has none)
    def compile_or_warm_up_model(self) -> None:
        """Fewer launches per step (minivllm/worker/compilation.py): torch.compile, then decode
        graphs over this pool (a graph records the pool's addresses: a new pool recaptures)."""
        vc = self.vllm_config
        self.compiled = set_compilation(self.model, vc.compilation_config.level)
        if use_cuda_graphs(vc, self.device, self.tp, self.attention_backend):
            self.cuda_graphs = CUDAGraphRunner(self.model, vc.scheduler_config.max_num_seqs,
                                               vc.model_config.max_model_len,
                                               self.block_size, self.decode_scratch, self.device)

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        for i, attn in enumerate(self.model.attention_layers()):
            attn.k_cache = kv_cache[i, 0]
            attn.v_cache = kv_cache[i, 1]
            attn.backend = self.attention_backend
            attn.kv_cache_dtype = self.kv_cache_dtype

    # --8<-- [start:prepare]
    def prepare(self, seqs: list[CachedRequestState], num_new_tokens: list[int]):
        """Flatten the step's work into input_ids, positions and attention metadata."""
        input_ids, positions, slot_mapping, query_start_loc, seq_lens = [], [], [], [0], []
        bs = self.block_size
        for seq, n in zip(seqs, num_new_tokens):
            start = seq.num_computed_tokens
            end = seq.num_computed_tokens + n
            input_ids += (seq.token_ids + seq.spec_token_ids)[start:end]   # drafts last
            positions += range(start, end)
            slot_mapping += [seq.block_table[p // bs] * bs + p % bs for p in range(start, end)]
            query_start_loc.append(query_start_loc[-1] + n)
            seq_lens.append(end)
        if self.lora_manager:                # each token's adapter slot, once for every layer
            self.lora_manager.set_batch([s.lora_int_id for s in seqs], num_new_tokens,
                                        self.device)
        width = max(len(s.block_table) for s in seqs)
        block_tables = [b for s in seqs for b in s.block_table + [0] * (width - len(s.block_table))]
        put = self.inputs.put                # persistent buffers; pinned, non-blocking on CUDA
        md = AttentionMetadata(
            slot_mapping=put("slot_mapping", slot_mapping),
            query_start_loc=put("query_start_loc", query_start_loc),
            seq_lens=put("seq_lens", seq_lens),
            block_tables=put("block_tables", block_tables).view(len(seqs), width),
            max_query_len=max(num_new_tokens), max_seq_len=max(seq_lens),
            decode_scratch=self.decode_scratch)
        return put("input_ids", input_ids), put("positions", positions), md
    # --8<-- [end:prepare]

    def allocate_host_kv_cache(self, num_blocks: int) -> torch.Tensor:
        """A pool of num_blocks blocks of the device pool's layout in host memory (pinned on
        CUDA): V0's swap pool, the CPU offloading tier."""
        return allocate_kv_cache(self.kv_config, num_blocks, self.block_size, self.dtype,
                                 torch.device("cpu"), self.kv_cache_dtype,
                                 pin_memory=self.device.type == "cuda")

    # --8<-- [start:execute_model]
    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """One step: the runner's own state brought up to date from the scheduler's messages,
        the block copies, one forward pass, the sampled tokens, and the drafts for the next
        step. Under tensor parallelism every rank runs this on the same messages and meets
        the others in the forward's collectives; only rank 0 samples and drafts."""
        so, timer = scheduler_output, PhaseTimer(self.device)    # the host's share (issue 65)
        self._update_states(so)
        copy_blocks(so.blocks_to_copy, self.kv_cache, self.kv_cache)
        if not so.req_ids:
            return ModelRunnerOutput()
        states = [self.requests[req_id] for req_id in so.req_ids]
        num_tokens = [so.num_scheduled_tokens[req_id] for req_id in so.req_ids]
        sampling, logits = self.run(states, num_tokens, so.sampling, timer)
        if not self.is_driver:               # split: the driver samples for all
            return ModelRunnerOutput()
        sampled = [states[i] for i in sampling]
        output = self.sample(sampled, logits)
        if self.drafter is not None:         # drafts for the next step (speculative decoding)
            output.draft_token_ids = self.drafter.propose(sampled, output)
        if self.vllm_config.scheduler_config.async_scheduling:    # the core learns them later
            for req_id, draws in output.sampled.items():
                self.requests[req_id].token_ids += [token_id for token_id, _ in draws]
        timer.lap("sample")
        output.timings = timer.times
        return output

    def _update_states(self, so: SchedulerOutput) -> None:
        """Finished requests forgotten (their sampling state and the drafter's too); new ones
        whole; held ones: their new tokens, block tables, computed counts, drafts and grammar
        bitmask rows."""
        for req_id in so.finished_req_ids:
            if self.requests.pop(req_id, None) is not None:
                self.sampler.free(req_id)
        if self.drafter is not None and so.finished_req_ids:
            self.drafter.free(so.finished_req_ids)
        for new in so.scheduled_new_reqs:
            self.requests[new.req_id] = CachedRequestState.from_new(new)
        cached = so.scheduled_cached_reqs
        for req_id, new_token_ids, block_ids, num_computed in zip(
                cached.req_ids, cached.new_token_ids, cached.block_ids,
                cached.num_computed_tokens):
            state = self.requests[req_id]
            state.token_ids += new_token_ids        # what the core appended since last time
            state.block_table = block_ids
            state.num_computed_tokens = num_computed
        for req_id in so.req_ids:
            state = self.requests[req_id]
            state.spec_token_ids = so.scheduled_spec_decode_tokens.get(req_id, [])
            state.grammar_bitmask = None
        for row, req_id in enumerate(so.structured_output_request_ids):
            self.requests[req_id].grammar_bitmask = so.grammar_bitmask[row]
    # --8<-- [end:execute_model]

    @torch.inference_mode()
    def run(self, seqs: list[CachedRequestState], num_new_tokens: list[int],
            sampling: list[bool] | None = None, timer: PhaseTimer | None = None):
        """One forward pass. Returns the indices (into seqs) of the sequences that sample
        (`sampling`; None: Request.samples_after) and their logits, (S, vocab) float32: a
        row per sequence, its last, or k + 1 rows for one verifying k drafts, the last last.
        timer: laps "prepare" and "forward" (worker/phase_timer.py; None: not timed, and on
        CUDA no wait for the device: the drafter's runs, scoring)."""
        input_ids, positions, md = self.prepare(seqs, num_new_tokens)
        if sampling is None:
            sampling = [s.samples_after(n) for s, n in zip(seqs, num_new_tokens)]
        sampling = [i for i, samples in enumerate(sampling) if samples]
        rows = md.query_start_loc[1:][sampling] - 1 if sampling else None
        drafts = [len(seqs[i].spec_token_ids) for i in sampling]
        if any(drafts):                     # the rows that verify each draft, then the last
            rows = torch.cat([torch.arange(r - k, r + 1, device=rows.device)
                              for r, k in zip(rows.tolist(), drafts)])
        if timer is not None:
            timer.lap("prepare")
        logits = self.forward(input_ids, positions, md, rows)   # (S + drafts, vocab)
        if timer is not None:
            timer.lap("forward", device=True)
        return sampling, logits

    def forward(self, input_ids, positions, md, rows) -> torch.Tensor | None:
        """The forward pass and the logits of `rows` (None: no logits). Under tensor
        parallelism every rank runs this, in step, on the same inputs; under pipeline
        parallelism a stage after the first starts from the previous one's hidden states, and
        one before the last sends its own on and computes no logits."""
        hidden = None
        if self.pp is not None and not self.pp.is_first:
            hidden = self.pp.recv((len(input_ids), self.hf_config.hidden_size), self.dtype)
        if self.cuda_graphs is not None and self.cuda_graphs.can_run(input_ids, md):
            hidden = self.cuda_graphs.run(input_ids, positions, md)    # decode: one replay
        else:
            hidden = self.model(input_ids, positions, md, hidden)      # (T, hidden)
        if self.pp is not None and not self.pp.is_last:
            self.pp.send(hidden)
            return None
        return None if rows is None else self.model.compute_logits(hidden[rows])

    # --8<-- [start:sample]
    def sample(self, seqs: list[CachedRequestState], logits: torch.Tensor | None
               ) -> ModelRunnerOutput:
        """Draw the tokens of the requests that sample this step. logits: their rows from
        `run`, one per request, or k + 1 for a request verifying k drafts (its last row
        last). A failure confined to some requests fails those requests alone
        (output.errors); the others go on."""
        out = ModelRunnerOutput()
        if not seqs:
            return out
        last = []
        draft_rows = {}
        start = 0
        for seq in seqs:
            k = len(seq.spec_token_ids)
            if k:                            # the draft rows wait for the rejection sampler
                draft_rows[seq.req_id] = logits[start:start + k]
            last.append(start + k)
            start += k + 1
        draws = self.sampler.draw(logits[last], seqs, out.errors)
        for seq, draw in zip(seqs, draws):
            if seq.req_id in out.errors:
                continue
            if seq.req_id in draft_rows:                            # drafts, then one more
                try:
                    out.sampled[seq.req_id] = accept_drafts(
                        seq, draft_rows[seq.req_id], draw,
                        self.sampler.generator(seq.req_id, seq.sampling_params.seed))
                except Exception as e:                              # noqa: BLE001
                    out.errors[seq.req_id] = f"output processing failed: {e!r}"
            else:
                out.sampled[seq.req_id] = [draw]
        return out
    # --8<-- [end:sample]

    @torch.inference_mode()
    def prompt_logits(self, token_ids: list[int], block_table: list[int]) -> torch.Tensor:
        """Logits at every position of token_ids, computed into the blocks of block_table:
        (n, vocab). For scoring and for checking the model against a reference; the serving
        path never needs them."""
        n = len(token_ids)
        seq = CachedRequestState("score", list(token_ids), n, SamplingParams(), block_table, 0)
        input_ids, positions, md = self.prepare([seq], [n])
        return self.forward(input_ids, positions, md, torch.arange(n, device=self.device))
