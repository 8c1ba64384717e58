"""What one engine step costs, in seconds, on a device that may not be here: a model's shapes
(named, or any Llama/Qwen config.json), a hardware profile, and roofline.StepCost's FLOPs and
bytes of the step, per GPU under tensor parallelism, per stage under pipeline parallelism.

    profile = get_profile("H100")                       # data-sheet peaks, assumed efficiencies
    timer = StepTimer(model_config("Llama-3-70B"), profile, tensor_parallel_size=8)
    timer.time([512], [512])                            # one 512-token prefill, seconds
    timer.time([1] * 64, [900] * 64)                    # 64 sequences decoding

A step's time is

    overhead + per_seq x sequences + prefill_overhead (if it computes a prompt)
        + combine(compute, memory) + collectives
    compute = linear FLOPs x row cost / (peak x compute_efficiency)
              + prefill attention FLOPs / (peak x attention_efficiency)
              + decode attention FLOPs / (peak x decode_attention_efficiency)
    memory  = bytes moved / (bandwidth x memory_efficiency)
    collectives = (2 all-reduces per layer + 1 after the embedding)
                  x (2 (tp - 1) / tp x tokens x hidden / link_bandwidth + link_latency)
                  + the logits' all-gather, (tp - 1) / tp x sampled x vocab / link_bandwidth
                  + link_latency    (vocab and hidden in bytes: one row's)

A pipeline stage pays its share of the layers' terms (FLOPs, bytes, all-reduces, the per-
sequence and prefill terms), the embedding's all-reduce on the first, the logits' all-gather
and the per-step overhead on the last stage, where the core and the sampler are (checked
against real pp=2 stages: tests/test_simulator_parallel.py).

`combine` is max on a GPU (its copy engines and tensor cores overlap: the roofline) and a sum
on a CPU (one core does both in turn; a fit decides how much of each). A profile is either a
**measured fit** (`calibrate`, over real engine steps on this machine, least squares) or a
**data sheet**: peak numbers from the vendor's sheet with efficiencies that are assumptions,
labelled as such, until a GPU run replaces them with a fit. The row cost is 1 on a data
sheet; a CPU fit carries a table, the linear layers timed alone at each row count, since a
CPU's GEMM is far from linear in its rows (HardwareProfile.linear_row_cost).

No vLLM twin: vLLM has no simulator. Vidur (Agrawal et al., MLSys 2024) profiles each operator
and predicts with random forests; this is the one-line roofline version of that idea. Left out:
MoE, quantized weights, and CUDA-graph buckets. (A prefix-cache hit's tokens are not computed,
which the scheduler counts; their keys are still read, which the context lengths count.)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from minivllm.benchmarks.roofline import StepCost
from minivllm.config import HfConfig
from minivllm.distributed.pipeline import check_pipeline_parallel, get_pp_indices

DATA = Path(__file__).parent / "data"
# Named model shapes: the shape fields of each model's published config.json, in data/models/.
MODEL_SHAPES = sorted(p.stem for p in (DATA / "models").glob("*.json"))


def model_config(model) -> HfConfig:
    """An HfConfig from a name in MODEL_SHAPES, a config.json path, a config dict, or an
    HfConfig (returned as it is)."""
    if isinstance(model, HfConfig):
        return model
    if isinstance(model, str) and model in MODEL_SHAPES:
        model = DATA / "models" / f"{model}.json"
    if isinstance(model, (str, Path)):
        path = Path(model)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ValueError(f"unknown model {str(model)!r}: give one of "
                             f"{sorted(MODEL_SHAPES)} or a Hugging Face config.json")
        model = json.loads(path.read_text())
    return HfConfig.from_hf_dict(model)


@dataclass(frozen=True)
class HardwareProfile:
    """One device (one GPU of a tensor-parallel group, or this CPU) as the cost model sees it."""

    name: str
    kind: str                      # "data-sheet" or "measured fit"
    source: str                    # where the numbers come from
    dtype: str                     # the weights' and KV cache's dtype
    peak_flops: float              # dense FLOP/s of that dtype
    bandwidth: float               # memory bytes/s
    memory_bytes: float            # device memory (the KV pool is what the weights leave)
    link_bandwidth: float = 0.0    # bytes/s per device for all-reduce (NVLink, PCIe)
    link_latency: float = 0.0      # seconds per all-reduce
    # bytes/s each way between the device and host memory (PCIe: the CPU tier's copies);
    # 0: one memory (a CPU), where a copy reads and writes it: bandwidth / 2
    host_bandwidth: float = 0.0
    overhead: float = 0.0          # seconds per step: scheduling, launch, sampling, Python
    per_seq: float = 0.0           # seconds per sequence in the step (metadata, sampling)
    compute_efficiency: float = 1.0    # share of peak_flops reached by the linear layers
    attention_efficiency: float = 1.0  # ... by attention over several new tokens (prefill)
    memory_efficiency: float = 1.0     # share of bandwidth reached by decode's reads
    overlap: bool = True               # compute and memory overlap (max) or not (sum)
    # ... by a decode's attention (one query over its context); None: attention_efficiency
    decode_attention_efficiency: float | None = None
    prefill_overhead: float = 0.0      # seconds more for a step that computes a prompt chunk
    # The linear layers' seconds per row at 1, 2, ... rows, relative to their rate at the
    # table's last row count (measured by calibrate: on a CPU, steps of 8 rows);
    # None, or rows past the table: every row costs the same (a GPU's data sheet).
    linear_row_cost: tuple[float, ...] | None = None

    @property
    def label(self) -> str:
        return f"{self.name} ({self.kind})"


GiB = 2**30
# Data-sheet profiles, in data/profiles.json: peaks from NVIDIA's product briefs (dense BF16
# tensor FLOP/s, memory bandwidth, NVLink or PCIe bandwidth per GPU and direction, memory).
# Their efficiencies and overheads are ASSUMPTIONS, not measurements: 60% of peak for large
# GEMMs and 40% for attention (the range the FlashAttention-2 paper reports on A100), 75% of
# bandwidth for decode's weight reads, 4 ms per step of scheduling and sampling outside the GPU
# (vLLM V1 with CUDA graphs, order of magnitude), 15 us per all-reduce. A fit from a GPU run
# (calibrate.py on that GPU) replaces them.
PROFILES = {name: HardwareProfile(**fields) for name, fields in
            json.loads((DATA / "profiles.json").read_text()).items()}
# One direction of a PCIe Gen5 x16 link, for "the same GPUs without NVLink" (lesson 17).
PCIE_GEN5_BANDWIDTH = 64e9


def profile_path() -> Path:
    """Where `calibrate` stores this machine's fit: the user cache (MINIVLLM_CACHE, as the
    converted model), one file per host, since a fit belongs to the machine, not the package."""
    root = Path(os.environ.get("MINIVLLM_CACHE", Path.home() / ".cache" / "minivllm"))
    return root / "profiles" / f"cpu-{socket.gethostname()}.json"


def save_profile(profile: HardwareProfile, path: Path | None = None) -> Path:
    path = Path(path or profile_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(profile), indent=1))
    return path


def get_profile(profile) -> HardwareProfile:
    """A HardwareProfile from a name in PROFILES, "cpu" (this machine's stored fit), a JSON
    file written by save_profile, or a HardwareProfile (returned as it is)."""
    if isinstance(profile, HardwareProfile):
        return profile
    if profile in PROFILES:
        return PROFILES[profile]
    path = profile_path() if profile == "cpu" else Path(profile)
    if not path.is_file():
        hint = ("run `minivllm simulate --calibrate` first" if profile == "cpu"
                else f"give one of {sorted(PROFILES)}, 'cpu' or a profile JSON file")
        raise ValueError(f"no hardware profile {str(profile)!r} ({path}): {hint}")
    fields = json.loads(path.read_text())
    known = {f.name for f in dataclasses.fields(HardwareProfile)}
    if stale := sorted(set(fields) - known):     # written by an older minivllm
        raise ValueError(f"{path} has fields this version does not know ({', '.join(stale)}): "
                         "run `minivllm simulate --calibrate` again")
    if fields.get("linear_row_cost") is not None:           # JSON has lists, not tuples
        fields["linear_row_cost"] = tuple(fields["linear_row_cost"])
    return HardwareProfile(**fields)


class StepTimer:
    """Seconds per step for one model on one profile, tensor_parallel_size devices; with
    pipeline_parallel_size > 1, for one stage of it (`stage`): its layers as vLLM splits them
    (get_pp_indices), its share of their weights and KV, and the LM head on the last."""

    def __init__(self, mc: HfConfig, profile: HardwareProfile, tensor_parallel_size: int = 1,
                 pipeline_parallel_size: int = 1, stage: int = 0):
        tp = tensor_parallel_size
        if mc.num_attention_heads % tp:
            raise ValueError(f"tensor_parallel_size={tp} must divide the model's "
                             f"{mc.num_attention_heads} attention heads")
        check_pipeline_parallel(mc, pipeline_parallel_size)
        cost = StepCost.of(mc, getattr(torch, profile.dtype))
        start, end = get_pp_indices(cost.layers, stage, pipeline_parallel_size)
        share = (end - start) / cost.layers
        last = stage == pipeline_parallel_size - 1
        # A stage pays its share of the layers' work: FLOPs, bytes, the weights a prefill step
        # repacks and the per-sequence term (attention calls, layer by layer); the per-step
        # overhead (scheduling, sampling, outputs) falls on the last, where the core is.
        self.share = share
        self.step_share = 1.0 if last else share
        self.cost = dataclasses.replace(
            cost, linear_params=round(cost.linear_params * share), layers=end - start,
            kv_token_bytes=round(cost.kv_token_bytes * share),
            head_params=cost.head_params if last else 0)
        self.profile = profile
        self.tp = tp
        # Per device: each weight is split tp ways; K/V heads too, or replicated if fewer.
        self.kv_share = max(1, mc.num_key_value_heads // tp) / mc.num_key_value_heads
        self.weight_bytes = self.cost.weight_bytes / tp
        # A measured row cost timed the linears whole, their weights' reads included: the
        # memory term then moves only the KV and the activations.
        self.weight_reads = 0 if profile.linear_row_cost else self.weight_bytes
        self.kv_token_bytes = self.cost.kv_token_bytes * self.kv_share
        p = profile
        self.s_per_flop = 1 / (p.peak_flops * p.compute_efficiency) / tp
        self.s_per_attn_flop = 1 / (p.peak_flops * p.attention_efficiency) / tp
        self.s_per_decode_attn_flop = 1 / (p.peak_flops * (p.decode_attention_efficiency
                                                           or p.attention_efficiency)) / tp
        self.s_per_byte = 1 / (p.bandwidth * p.memory_efficiency)
        self.attn_unit = 2 * self.cost.layers * self.cost.q_dim     # 4 L q x (sum of j) / 2
        # Under TP, what the model's layers meet (distributed/layers.py): two all-reduces per
        # layer, one after the vocabulary-split embedding (first stage), and an all-gather of
        # the logits (last stage), a row of vocab_size per sampled row.
        self.num_all_reduces = 2 * self.cost.layers + (stage == 0) if tp > 1 else 0
        self.logits_bytes = mc.vocab_size * cost.elem if last and tp > 1 else 0
        self.ring = 2 * (tp - 1) / tp / p.link_bandwidth if tp > 1 else 0.0

    def copy_time(self, num_blocks: int, block_size: int) -> float:
        """Seconds to copy num_blocks KV blocks between this device and host memory (each
        device its own heads' share over its own link): the CPU tier's loads and stores."""
        p = self.profile
        return num_blocks * block_size * self.kv_token_bytes / (p.host_bandwidth
                                                                or p.bandwidth / 2)

    def kv_pool_blocks(self, block_size: int, utilization: float = 0.9) -> int:
        """KV blocks that fit beside the weights in `utilization` of one device's memory."""
        free = self.profile.memory_bytes * utilization - self.weight_bytes
        blocks = int(free // (self.kv_token_bytes * block_size))
        if blocks < 1:
            raise ValueError(f"{self.weight_bytes / GiB:.1f} GiB of weights per device leave no "
                             f"KV memory on {self.profile.label}: raise tensor_parallel_size")
        return blocks

    def features(self, new_tokens, context_lens, sampled: int) -> tuple[float, ...]:
        """(sequences, linear FLOPs, prefill attention FLOPs, decode attention FLOPs, bytes,
        prefills) of one step on one device: the same counts as StepCost.step, in closed form
        (the attention sum over a chunk is an arithmetic series), since a simulation asks this
        once per step. A sequence computing one token is a decode, one computing several a
        prefill (a prompt chunk, a recompute, a verification of drafts). With the profile's
        linear_row_cost, the linear FLOPs are those of the rows' measured cost: 15 rows that
        cost 2.2 times as much per row as 128 do count as 32 (rows_cost)."""
        c = self.cost
        tokens = sum(new_tokens)
        attn = [n * (2 * ctx - n + 1) for n, ctx in zip(new_tokens, context_lens)]
        prefill = sum(a for a, n in zip(attn, new_tokens) if n > 1)
        rows, head_rows = self.rows_cost(tokens), self.rows_cost(sampled)
        linear = 2 * c.linear_params * rows + 2 * c.head_params * head_rows
        moved = (self.weight_reads + self.kv_token_bytes * sum(context_lens)
                 + 4 * c.hidden_bytes * tokens)
        return (len(new_tokens), linear, self.attn_unit * prefill,
                self.attn_unit * (sum(attn) - prefill), moved,
                sum(n > 1 for n in new_tokens))

    def rows_cost(self, rows: int) -> float:
        """What `rows` rows through the linear layers cost, in rows at the full rate: rows
        itself unless the profile measured otherwise (linear_row_cost). On a CPU, MKL's GEMM
        works in blocks of 8 columns, which the engine's `linear` pads to: on a Zen 3, 15 rows
        took 77 ms and 16 rows 72 (139 and 70 before it padded), 128 rows 304."""
        table = self.profile.linear_row_cost
        return rows * table[rows - 1] if table and 0 < rows <= len(table) else rows

    def time(self, new_tokens, context_lens, sampled: int | None = None) -> float:
        """Seconds for a step in which sequence i computes new_tokens[i] tokens and then
        holds context_lens[i]; `sampled` rows reach the LM head (default: one each)."""
        sampled = len(new_tokens) if sampled is None else sampled
        return self.time_of(*self.features(new_tokens, context_lens, sampled), sum(new_tokens),
                            sampled)

    def time_of(self, num_seqs: int, linear: float, attn: float, decode_attn: float,
                moved: float, prefills: int, tokens: int, sampled: int = 0) -> float:
        p = self.profile
        compute = (linear * self.s_per_flop + attn * self.s_per_attn_flop
                   + decode_attn * self.s_per_decode_attn_flop)
        memory = moved * self.s_per_byte
        busy = max(compute, memory) if p.overlap else compute + memory
        message = tokens * self.cost.hidden_bytes           # one all-reduce's payload
        comm = self.num_all_reduces * (message * self.ring + p.link_latency)
        if self.logits_bytes and sampled:               # a ring all-gather: half the traffic
            comm += sampled * self.logits_bytes * self.ring / 2 + p.link_latency
        return (p.overhead * self.step_share + (p.per_seq * num_seqs + p.prefill_overhead
                                                * (prefills > 0)) * self.share + busy + comm)


# --8<-- [start:fit]
def fit_profile(rows: list[tuple[float, ...]], durations: list[float], peak_flops: float,
                bandwidth: float, name: str = "this CPU", dtype: str = "float32",
                memory_bytes: float = 8 * GiB,
                linear_row_cost: tuple[float, ...] | None = None) -> HardwareProfile:
    """Least squares, non-negative, of step seconds on [1, sequences, holds a prefill, linear
    FLOPs, prefill attention FLOPs, decode attention FLOPs] (rows from StepTimer.features on a
    1-device profile with the same linear_row_cost), once the bytes' time at the measured
    `bandwidth` is taken off: the intercept is the per-step overhead, the others are seconds
    per unit, the FLOPs' turned into efficiencies against the measured peaks.
    The bytes are not fitted: without a row cost they are nearly all the weights, the same in
    every step, so a fitted bytes coefficient and the overhead trade places from one
    calibration to the next (collinear columns); with one, the weights' reads are inside the
    timed linears and the bytes are the KV's alone. Read at the measured bandwidth, whatever
    that misses is much the same every step, and the overhead takes it. Each step's error
    counts relative to its seconds: a shared CPU's noise is a share of the step, and in
    absolute terms the few long prefills would outvote the many short decodes that pin the
    overhead down. A coefficient that comes out negative is dropped and the rest refitted
    (the active-set idea of Lawson-Hanson's NNLS, one column at a time)."""
    rows, t = np.asarray(rows, dtype=float), np.asarray(durations, dtype=float)
    seqs, linear, attn, decode_attn, moved, prefills = rows.T
    X = np.column_stack([np.ones(len(rows)), seqs, prefills > 0, linear, attn, decode_attn])
    X, y = X / t[:, None], (t - moved / bandwidth) / t                      # relative errors
    scale = np.where(X.max(axis=0) > 0, X.max(axis=0), 1.0)   # 1 and 1e9 FLOPs: condition it
    active = list(range(X.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(X[:, active] / scale[active], y, rcond=None)
        if (coef >= 0).all():
            break
        active.pop(int(np.argmin(coef)))
    full = np.zeros(X.shape[1])
    full[active] = coef / scale[active]
    overhead, per_seq, prefill_overhead, s_linear, s_attn, s_decode_attn = full
    eff = lambda s: 1 / (s * peak_flops) if s > 0 else math.inf  # noqa: E731 (term unseen)
    return HardwareProfile(name, kind="measured fit", source=f"{len(y)} engine steps, "
                           "least squares (minivllm simulate --calibrate)", dtype=dtype,
                           peak_flops=peak_flops, bandwidth=bandwidth,
                           memory_bytes=memory_bytes, overhead=float(overhead),
                           per_seq=float(per_seq), compute_efficiency=eff(s_linear),
                           attention_efficiency=eff(s_attn),
                           decode_attention_efficiency=eff(s_decode_attn), overlap=False,
                           prefill_overhead=float(prefill_overhead),
                           linear_row_cost=linear_row_cost)
# --8<-- [end:fit]
