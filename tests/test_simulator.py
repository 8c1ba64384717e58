"""minivllm/simulator/: the cost model's counts, the fit, the simulated schedule, the capacity
search and the CLI (device-free, fast); then the check that matters, on the real model: a
calibrated simulation of a workload the calibration did not see schedules exactly as the
engine did, step for step, and predicts its seconds.

The timing check runs on a shared, loaded machine: calibration and both real runs happen in the
same test, back to back, and the test prints the prediction error beside the run-to-run noise
of the real engine (docs/benchmarks.md records a run)."""

from __future__ import annotations

import dataclasses
import json
import re
import time

import numpy as np
import pytest
import torch

from minivllm.benchmarks.roofline import StepCost
from minivllm.simulator.cli import capacity
from minivllm.benchmarks.workloads import Request
from minivllm.entrypoints.cli import main
from minivllm.sampling_params import SamplingParams
from minivllm.simulator import (PROFILES, SLO, StepTimer, get_profile, model_config, simulate,
                                simulate_disaggregated, synthetic_requests)
from minivllm.simulator.cost_model import fit_profile
from minivllm.workloads import poisson_arrivals


def test_features_are_stepcosts_counts():
    """The closed form the simulator uses per step equals roofline.StepCost.step."""
    mc = model_config("Llama-3-8B")
    timer = StepTimer(mc, PROFILES["H100"])
    cost = StepCost.of(mc, torch.bfloat16)
    new, ctx = [512, 1, 1, 37], [512, 900, 17, 1037]
    seqs, linear, attn, decode_attn, moved, prefills = timer.features(new, ctx, sampled=3)
    assert (linear + attn + decode_attn, moved) == cost.step(new, ctx, sampled=3)
    assert (seqs, prefills) == (4, 2)
    # decode attention: one query over each context (4 L q_dim ctx FLOPs), apart from prefill's
    assert decode_attn == 4 * mc.num_hidden_layers * cost.q_dim * (900 + 17)
    # a measured row cost (a CPU's sawtooth): 15 rows that take as long as 26 count as 26 in
    # the linear layers, the LM head's one row as one; past the table, rows are rows. The
    # weights' reads were timed with the linears: the bytes are the KV's and activations' alone
    sawtooth = StepTimer(mc, dataclasses.replace(PROFILES["H100"],
                                                 linear_row_cost=(1.0,) * 14 + (26 / 15, 1.0)))
    assert sawtooth.features([15], [15], 1)[1] == pytest.approx(
        timer.features([26], [26], 1)[1], rel=1e-12)
    for new, ctx, sampled in (([15], [15], 1), ([40], [40], 40)):
        a, b = sawtooth.features(new, ctx, sampled), timer.features(new, ctx, sampled)
        assert a[2:4] + a[5:] == b[2:4] + b[5:]
        assert a[4] == b[4] - timer.weight_bytes
    assert sawtooth.features([40], [40], 40)[:2] == timer.features([40], [40], 40)[:2]


def test_fit_recovers_a_known_profile():
    """Step times made from a known CPU-like profile: least squares gives it back. The bytes
    are read at the measured bandwidth, not fitted: a slower real read (memory_efficiency 0.8)
    costs the same weights every step, so the overhead takes it, and the step times the fit
    predicts are still the truth's."""
    truth = dataclasses.replace(PROFILES["L4"], overlap=False, overhead=2e-3, per_seq=1e-4,
                                compute_efficiency=0.5, attention_efficiency=0.2,
                                decode_attention_efficiency=0.05, prefill_overhead=5e-3,
                                memory_efficiency=1.0, link_bandwidth=0)
    timer = StepTimer(model_config("SmolLM2-135M"), truth)
    rng = np.random.default_rng(0)
    rows, seconds = [], []
    for _ in range(40):
        b = int(rng.integers(1, 32))
        new = rng.integers(1, 200, b).tolist() if rng.random() < 0.5 else [1] * b
        ctx = [n + int(rng.integers(0, 500)) for n in new]
        rows.append(timer.features(new, ctx, b))
        seconds.append(timer.time(new, ctx, b))
    fit = fit_profile(rows, seconds, truth.peak_flops, truth.bandwidth)
    for name in ("overhead", "per_seq", "compute_efficiency", "attention_efficiency",
                 "decode_attention_efficiency", "prefill_overhead", "memory_efficiency"):
        assert getattr(fit, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    # Decode steps only (the bytes nearly all weights), read at 80% of the measured bandwidth:
    # the fit still predicts each step, the weights' extra time in its overhead.
    slow = StepTimer(model_config("SmolLM2-135M"),
                     dataclasses.replace(truth, memory_efficiency=0.8))
    steps = [([1] * b, [c] * b) for b in (1, 2, 4, 8) for c in (50, 200, 400)]
    fit = fit_profile([timer.features(n, c, len(n)) for n, c in steps],
                      [slow.time(n, c) for n, c in steps], truth.peak_flops, truth.bandwidth,
                      dtype=truth.dtype)
    fitted = StepTimer(model_config("SmolLM2-135M"), fit)
    for n, c in steps:
        assert fitted.time(n, c) == pytest.approx(slow.time(n, c), rel=0.02)
    weights = timer.weight_bytes / truth.bandwidth
    assert fit.overhead == pytest.approx(truth.overhead + weights * (1 / 0.8 - 1), rel=0.05)


def test_linears_alone_times_the_linears_not_their_inputs(monkeypatch):
    """benchmarks/cpu.py linears_alone draws its random inputs before the clock starts: drawn
    inside it, they were a quarter of a 64-row measurement (and of calibrate's row table)."""
    from torch import nn
    from minivllm.benchmarks.cpu import linears_alone
    model = nn.ModuleDict({"up": nn.Linear(8, 32), "down": nn.Linear(32, 8),
                           "lm_head": nn.Linear(8, 16)})
    model.lm_head = model["lm_head"]
    randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *a, **k: time.sleep(0.5) or randn(*a, **k))
    start = time.perf_counter()
    assert linears_alone(model, 4, 1) < 0.5 < time.perf_counter() - start


def test_tensor_parallel_and_link_bandwidth():
    """70B decode: TP=8 reads an eighth of the weights per GPU, so its step is faster than
    TP=4's on NVLink; on a PCIe link the all-reduces cost more than NVLink's."""
    mc = model_config("Llama-3-70B")
    h100 = PROFILES["H100"]
    pcie = dataclasses.replace(h100, link_bandwidth=64e9)
    step = ([1] * 64, [1000] * 64)
    assert StepTimer(mc, h100, 8).time(*step) < StepTimer(mc, h100, 4).time(*step)
    assert StepTimer(mc, pcie, 8).time(*step) > StepTimer(mc, h100, 8).time(*step)
    # What the link carries, as the TP layers do: 2 all-reduces per layer and the embedding's
    # of (64 tokens, hidden), and an all-gather of 64 rows of logits; a ring moves
    # 2 (tp - 1) / tp of an all-reduce's bytes and (tp - 1) / tp of an all-gather's.
    elem = 2                                                    # bf16
    carried = ((2 * mc.num_hidden_layers + 1) * 64 * mc.hidden_size * 2 * 7 / 8
               + 64 * mc.vocab_size * 7 / 8) * elem
    slower = StepTimer(mc, pcie, 8).time(*step) - StepTimer(mc, h100, 8).time(*step)
    assert slower == pytest.approx(carried * (1 / 64e9 - 1 / h100.link_bandwidth), rel=1e-9)
    with pytest.raises(ValueError, match="leave no KV memory"):
        StepTimer(mc, h100, 1).kv_pool_blocks(16)
    with pytest.raises(ValueError, match="must divide"):
        StepTimer(mc, h100, 3)


def test_a_slower_machine_pays_every_term_that_much_more():
    """cli.slowed, what the seconds test and `--validate` correct for a machine's drift by:
    every step's seconds scale by the factor, whatever the step."""
    from minivllm.simulator.cli import slowed
    cpu = dataclasses.replace(PROFILES["L4"], overlap=False, overhead=0.01, per_seq=0.001,
                              prefill_overhead=0.02, linear_row_cost=(3.0, 2.0, 1.0))
    mc = model_config("Llama-3-8B")
    for step in [([1], [64]), ([1] * 3, [500] * 3), ([300, 1], [300, 90])]:
        assert StepTimer(mc, slowed(cpu, 1.7)).time(*step) == pytest.approx(
            1.7 * StepTimer(mc, cpu).time(*step), rel=1e-12)


def test_a_fitted_efficiency_over_one_is_called_what_it_is():
    """fitted_terms, the line --calibrate and lesson 17 print: an efficiency over 100% of the
    measured peak is said to be the machine's speed moving, not read as a number to believe."""
    from minivllm.simulator.cli import fitted_terms
    fit = dataclasses.replace(PROFILES["L4"], compute_efficiency=0.86, attention_efficiency=0.3,
                              decode_attention_efficiency=float("inf"))
    assert "linears at 86%" in fitted_terms(fit) and "too small to see" in fitted_terms(fit)
    assert "over 100%" not in fitted_terms(fit)
    faster = fitted_terms(dataclasses.replace(fit, compute_efficiency=1.56))
    assert "linears at 156%" in faster and "over 100%: the machine ran faster" in faster


def test_simulated_run_counts():
    """Every request gets exactly its max_tokens; a pool too small for the batch preempts
    (recompute), and swap mode swaps instead; blocks are all returned at the end."""
    reqs = synthetic_requests(40, prompt=(5.0, 0.5, 16, 400), output=(4.0, 0.5, 4, 200), seed=1)
    want = sum(r.params.max_tokens for r in reqs)
    small = dict(model="Qwen3-0.6B", profile="L4", max_num_seqs=32, num_kv_blocks=120)
    res = simulate(reqs, **small)
    assert res.num_output_tokens == want and np.isfinite(res.ttft).all()
    assert res.num_preemptions > 0 and res.steps[-1].stats.num_blocks_used == 0
    assert max(s.stats.num_blocks_used for s in res.steps) == 120
    swap = simulate(reqs, preemption_mode="swap", **small)
    assert sum(len(s.swapped_out) for s in swap.steps) > 0
    assert swap.num_output_tokens == want
    roomy = simulate(reqs, model="Qwen3-0.6B", profile="L4", max_num_seqs=32)
    assert roomy.num_preemptions == 0 and roomy.elapsed < res.elapsed


def test_prefix_caching_and_chunked_prefill_change_the_schedule():
    reqs = synthetic_requests(30, prompt=(4.0, 0.3, 16, 100), output=(3.0, 0.3, 4, 40),
                              shared_prefix=1024, seed=2)
    on = simulate(reqs, model="Llama-3-8B", profile="H100")
    off = simulate(reqs, model="Llama-3-8B", profile="H100", enable_prefix_caching=False)
    computed = lambda r: sum(s.num_prefill_tokens for s in r.steps)  # noqa: E731
    assert computed(on) < computed(off) / 2
    long = synthetic_requests(20, prompt=(7.5, 0.2, 1000, 4000), output=(4, 0.2, 8, 100))
    chunked = simulate(long, model="Llama-3-8B", profile="H100", max_num_batched_tokens=512)
    assert max(s.num_batched_tokens for s in chunked.steps) <= 512
    whole = simulate(long, model="Llama-3-8B", profile="H100", enable_chunked_prefill=False,
                     max_num_batched_tokens=8192)
    assert max(s.num_prefill_tokens for s in whole.steps) > 512


def test_the_cpu_tier_saves_prefill_and_its_copies_cost_their_bytes():
    """Eight 2,048-token documents asked about twice, one request at a time, on an H100 whose
    GPU pool holds two of them: with a CPU tier, the second pass loads every document's blocks
    instead of computing them, and each step pays its copies' bytes over the host link. A
    link 64x slower lengthens the run by exactly those bytes' extra seconds (all arrive at
    once, so the schedule is the same), and at 1 GB/s a load costs more than the prefill it
    saves: where offloading pays is bandwidth against FLOPs."""
    docs = [[1000 * d + i for i in range(2048)] for d in range(8)]
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    reqs = [Request(doc, params) for doc in docs * 2]
    h100 = get_profile("H100")
    run = lambda size, profile=h100: simulate(  # noqa: E731
        reqs, model="Llama-3-8B", profile=profile, num_kv_blocks=300, max_num_seqs=1,
        kv_offloading_size=size)
    off, on = run(None), run(4)
    slow = run(4, dataclasses.replace(h100, host_bandwidth=1e9))
    computed = lambda r: sum(s.num_prefill_tokens for s in r.steps)  # noqa: E731
    assert computed(off) == 16 * 2048                   # the pool kept no document for pass 2
    assert computed(on) == 8 * 2048 + 8 * 16            # pass 2: each last block's tokens only
    stats = on.steps[-1].stats
    assert stats.external_prefix_cache_hit_tokens == 8 * (2048 - 16)
    assert stats.kv_offload_loaded_blocks == 8 * 127 and stats.kv_offload_stored_blocks == 8 * 128
    moved = (stats.kv_offload_load_bytes + stats.kv_offload_store_bytes)
    assert slow.elapsed - on.elapsed == pytest.approx(moved * (1 / 1e9 - 1 / 64e9), rel=1e-6)
    assert on.elapsed < off.elapsed < slow.elapsed
    assert [s.num_output_tokens for s in (off, on, slow)] == [16 * 4] * 3


def test_prefix_aware_routing_across_simulated_replicas():
    """Two simulated H100 replicas behind the front end's own router (minivllm/routing.py),
    fed by the simulated cores' KV events: eight 1,024-token documents arrive in pairs, then
    each is asked about again in another pairing. The load score places the second pass by
    arrival order; prefix-aware routing sends each question to the replica that holds its
    document, and computes only the last block of each."""
    docs = [[1000 * d + i for i in range(1024)] for d in range(8)]
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    second = [1, 0, 3, 2, 5, 4, 7, 6]              # each pair swapped: arrival order differs
    reqs = [Request(docs[d], params, arrival_time=0.5 * (i // 2)) for i, d in enumerate(range(8))]
    reqs += [Request(docs[d], params, arrival_time=10 + 0.5 * (i // 2))
             for i, d in enumerate(second)]
    run = lambda balance: simulate(  # noqa: E731
        reqs, model="Llama-3-8B", profile="H100", data_parallel_size=2,
        kv_events_config={"enable_kv_cache_events": True}, data_parallel_balance=balance)
    score, prefix = run("score"), run("prefix")
    computed = lambda r: sum(s.num_prefill_tokens for s in r.steps)  # noqa: E731
    replica = lambda r, i: r.choices[i].rank  # noqa: E731
    assert all(replica(prefix, 8 + i) == replica(prefix, d) for i, d in enumerate(second))
    assert any(replica(score, 8 + i) != replica(score, d) for i, d in enumerate(second))
    assert computed(prefix) == 8 * 1024 + 8 * 16           # pass 2: each last block only
    assert computed(score) > computed(prefix)
    assert [c.expected_cached_tokens for c in prefix.choices[8:]] == [1008] * 8


def test_disaggregated_prefill_and_decode_engines():
    """Two prefill engines and one decode engine: every request gets all its tokens; the
    prefill engines never decode, the decode engine never prefills (with room), and a
    request's TTFT holds its KV transfer: one request alone waits exactly prefill + transfer."""
    reqs = poisson_arrivals(synthetic_requests(60, prompt=(6.0, 0.5, 16, 2000),
                                               output=(4.0, 0.5, 4, 200), seed=5), 20, seed=5)
    kw = dict(model="Llama-3-8B", profile="H100", max_num_seqs=64, max_num_batched_tokens=1024)
    res = simulate_disaggregated(reqs, num_prefill=2, num_decode=1, **kw)
    assert res.num_output_tokens == sum(r.params.max_tokens for r in reqs)
    assert np.isfinite(res.ttft).all() and set(res.engine_steps) == {"prefill-0", "prefill-1",
                                                                      "decode-0"}
    prefill = res.engine_steps["prefill-0"] + res.engine_steps["prefill-1"]
    decode = res.engine_steps["decode-0"]
    assert sum(s.num_decode_tokens for s in prefill) == 0
    assert sum(s.num_prefill_tokens for s in prefill) == sum(len(r.prompt) for r in reqs)
    assert sum(s.num_prefill_tokens for s in decode) == 0 and len(decode) > len(prefill)
    # A decode pool too small for the batch preempts; then it recomputes only those requests.
    tight = simulate_disaggregated(reqs, num_decode=1, num_kv_blocks=400, **kw)
    preempted = {r for s in tight.engine_steps["decode-0"] for r in s.preempted}
    recomputed = {q.request_id for s in tight.engine_steps["decode-0"] for q in s.scheduled
                  if q.is_prefill}
    assert preempted and recomputed <= preempted
    assert tight.num_output_tokens == res.num_output_tokens
    # One request alone: TTFT = its prefill step + its KV over the link; a slower link, later.
    one = [dataclasses.replace(reqs[0], arrival_time=0.0)]
    n = len(one[0].prompt)
    timer = StepTimer(model_config("Llama-3-8B"), PROFILES["H100"])
    ttft = {}
    for link in (450e9, 10e9):
        alone = simulate_disaggregated(one, kv_link_bandwidth=link, **kw)
        want = (sum(s.duration for s in alone.engine_steps["prefill-0"])
                + timer.kv_token_bytes * n / link + PROFILES["H100"].link_latency)
        assert alone.ttft[0] == pytest.approx(want, rel=1e-9)
        ttft[link] = alone.ttft[0]
    assert ttft[10e9] > ttft[450e9] + 0.003      # 35 MB of K/V: 3.5 ms more at 10 GB/s


def test_capacity_search_brackets_the_slo():
    slo = SLO(ttft=0.5, itl=0.05)
    make = lambda: synthetic_requests(100, prompt=(6.0, 0.5, 16, 2000),  # noqa: E731
                                      output=(4.5, 0.5, 4, 400), seed=3)
    kw = dict(model="Llama-3-8B", profile="A100", max_num_seqs=128)
    rate, res = capacity(make, slo, lo=1.0, iterations=4, **kw)
    assert res.goodput(slo) >= 0.9
    above = simulate(poisson_arrivals(make(), rate * 1.5, seed=0), **kw)
    assert above.goodput(slo) < 0.9


def test_cli_prints_the_summary(capsys, tmp_path):
    main(["simulate", "--model", "Qwen3-0.6B", "--profile", "L4", "--num-prompts", "60",
          "--request-rate", "5", "--plot", str(tmp_path / "sim.png")])
    out = capsys.readouterr().out
    assert "simulated: Qwen3-0.6B on 1 x L4-24GB (data-sheet)" in out
    assert "requests 60" in out and "goodput" in out and (tmp_path / "sim.png").stat().st_size
    with pytest.raises(ValueError, match="unknown model"):
        model_config("Llama-9-1T")
    with pytest.raises(ValueError, match="no hardware profile"):
        get_profile("TPU")
    # a profile an older minivllm stored (min_rows, since replaced by linear_row_cost)
    stale = tmp_path / "old.json"
    stale.write_text(json.dumps({**dataclasses.asdict(PROFILES["L4"]), "min_rows": 2}))
    with pytest.raises(ValueError, match="min_rows.*simulate --calibrate"):
        get_profile(str(stale))


# ----------------------------------------------------------------- against the real engine
@pytest.fixture(scope="module")
def calibrated():
    """The packaged model and this machine's profile, fitted now (not read from the cache:
    the fit must describe the machine as loaded as it is during this test)."""
    from minivllm import LLM
    from minivllm.simulator.calibrate import calibrate
    llm = LLM(max_model_len=512, enable_prefix_caching=False)
    return llm, calibrate(llm, save=False)


def held_out(llm, unit: str, rate: float):
    """A workload the calibration did not see (its own seed, Poisson arrivals)."""
    from minivllm.workloads import lognormal_requests
    return poisson_arrivals(lognormal_requests(llm.tokenizer, 16, prompt=(4.3, 0.6, 16, 300),
                                               output=(3.0, 0.5, 4, 48), seed=32),
                            rate=rate, seed=32, unit=unit)


def test_simulated_schedule_equals_the_engines(calibrated):
    """Same requests, same output lengths (EOS ignored): every step schedules the same tokens
    for the same requests, chunks and preemptions included."""
    from minivllm.simulator.cli import run_both, schedule
    llm, profile = calibrated
    llm.reconfigure(num_kv_blocks=32, max_num_batched_tokens=64)
    try:
        real, sim = run_both(llm, held_out(llm, "steps", 0.5), profile)
    finally:
        llm.reconfigure(num_kv_blocks=None, max_num_batched_tokens=2048)
    assert real.steps[-1].stats.num_preemptions > 0          # the small pool preempts
    assert max(s.num_batched_tokens for s in real.steps) == 64   # prompts are chunked
    assert schedule(sim.steps) == schedule(real.steps)
    # the fit carries its timed rows: 1 to 128, each relative to 128 rows' cost per row
    table = profile.linear_row_cost
    assert len(table) == 128 and table[-1] == 1.0 and min(table) > 0
    assert sim.num_preemptions == real.steps[-1].stats.num_preemptions


# The target is 10% (issue 32; Vidur's published bound is 9%). The fit reads the bytes at the
# measured bandwidth, fits overhead, per-sequence and FLOP terms by relative least squares over
# five calibration workloads (docs/benchmarks.md). Its last bias (-15%) was the engine's, not
# the model's: fp32 batch-1 decode went through MKL's slow matrix-vector path; with one row sent
# as two columns, three quiet runs on a 2-core EPYC erred total -4% to -6%, p50 -6% to -10%.
# Since stop 58 a Zen 3 EPYC (AVX2) measured -17% to -22% in CI, which looked like a one-sign
# bias (issue 40) and was the machine's speed moving instead: the same calibration steps, served
# three times in one process a minute apart, took 5.0 / 5.9 / 7.8 s (one workload) while the
# held-out run repeated within 6%, and fits from them erred -22% to +3% on it. So the check
# measures the machine's speed against the fit on a calibration workload before and after each
# real run, and judges the prediction for a machine that much slower or faster (drift below);
# six such runs here: raw total errors -13% to +16%, drift-corrected -12% to +6%
# (docs/benchmarks.md). PP and DP (test_simulator_parallel.py) keep the raw bound.
PREDICTION_BOUND = 0.25
DRIFT_CORRECTED_BOUND = 0.20
# Beyond this spread between the two real runs, the two fits or the drift readings, the
# machine is too unsteady to judge a 20% claim (this VM: 7-19% between real runs a minute
# apart; at 10% the check skipped all three of stop 60's runs). An unsteady machine still
# has its prediction held to GROSS_BOUND before the skip: a broken cost model (a term dropped or
# counted twice) errs by more than any machine's drift seen here (at worst -38%, under a load
# average of 8), so the check never passes without judging something.
UNSTEADY = 0.15
GROSS_BOUND = 0.50


def test_simulated_seconds_within_twenty_percent_of_the_machine_as_it_ran(calibrated):
    """Total time and per-request p50 / p90 E2E latency, predicted vs measured, within
    DRIFT_CORRECTED_BOUND (every error is printed, raw and corrected). The real run is done
    twice; the spread between the two is the noise printed beside. Before, between and after
    them, a calibration workload is served for real and simulated: its real / simulated
    seconds is how much slower the machine runs now than when it was fitted (the drift), and
    the held-out run is judged against the fit slowed by that much. The profile is fitted twice
    too. When the two real runs' totals, the two fits' predicted totals or the three drift
    readings differ by more than UNSTEADY (a machine shared with other jobs), the claim cannot
    be judged: the errors are held to GROSS_BOUND only, and the test skips."""
    from minivllm.simulator.cli import (machine_drift, real_latencies, run_both, simulate_like,
                                        slowed)
    from minivllm.simulator.calibrate import calibrate, calibration_workloads
    llm, profile = calibrated
    reference = calibration_workloads(llm.tokenizer)[2]       # 10 mixed requests, ~4 s
    drifts, runs = [machine_drift(llm, profile, reference)], []
    for _ in range(2):
        runs.append(run_both(llm, held_out(llm, "seconds", 8.0), profile))
        drifts.append(machine_drift(llm, profile, reference))
    sim = runs[0][1]
    corrected = simulate_like(llm, held_out(llm, "seconds", 8.0),
                              slowed(profile, float(np.mean(drifts))))
    # The fit is a measurement too: a burst of load while it ran skews every prediction
    # (stop 47's CI: +31% total from one such fit). A second fit judges the first.
    again = simulate_like(llm, held_out(llm, "seconds", 8.0), calibrate(llm, save=False))
    fit_noise = abs(sim.elapsed - again.elapsed) / (sim.elapsed + again.elapsed)

    def numbers(total, e2e):
        return {"total": total, "p50": np.percentile(e2e, 50), "p90": np.percentile(e2e, 90)}
    real = [numbers(r.elapsed, real_latencies(r)["e2e"]) for r, _ in runs]
    pred, fixed = numbers(sim.elapsed, sim.e2e), numbers(corrected.elapsed, corrected.e2e)
    lines = []
    errors = {}
    for key in pred:
        measured = (real[0][key] + real[1][key]) / 2
        errors[key] = fixed[key] / measured - 1
        noise = abs(real[0][key] - real[1][key]) / measured
        lines.append(f"{key}: simulated {pred[key]:.3f} s (drift-corrected {fixed[key]:.3f}), "
                     f"measured {real[0][key]:.3f} / {real[1][key]:.3f} s: error "
                     f"{pred[key] / measured - 1:+.1%} (corrected {errors[key]:+.1%}), "
                     f"run-to-run noise {noise:.1%}")
    lines.append(f"drift (real / simulated seconds of a calibration workload, before, between "
                 f"and after): {' / '.join(f'{d:.3f}' for d in drifts)}")
    print("\n".join(lines))
    noise_total = abs(real[0]["total"] - real[1]["total"]) / (real[0]["total"] + real[1]["total"])
    print(f"a second fit predicts total {again.elapsed:.3f} s: fit-to-fit noise "
          f"{2 * fit_noise:.1%}")
    if 2 * max(noise_total, fit_noise) > UNSTEADY or max(drifts) / min(drifts) > 1 + UNSTEADY:
        gross = {k: e for k, e in errors.items() if abs(e) >= GROSS_BOUND}
        assert not gross, (f"prediction off by {GROSS_BOUND:.0%} or more, even for an unsteady "
                           f"machine:\n" + "\n".join(lines))
        pytest.skip(f"machine too loaded to judge (fits: {sim.elapsed:.3f} / "
                    f"{again.elapsed:.3f} s): " + "; ".join(lines))
    bad = {k: e for k, e in errors.items() if abs(e) >= DRIFT_CORRECTED_BOUND}
    assert not bad, (f"prediction off by {DRIFT_CORRECTED_BOUND:.0%} or more:\n"
                     + "\n".join(lines))


def test_validate_reports_the_error_per_kind_of_step(calibrated):
    """`minivllm simulate --validate`'s report on a small held-out workload: every kind of
    step the real runs took has a row, its counts add up to both real runs' steps, and each
    percentile has its error beside the real runs' spread."""
    from minivllm.simulator.calibrate import calibration_workloads
    from minivllm.simulator.cli import fitted_terms, validate
    from minivllm.workloads import bimodal_requests
    llm, profile = calibrated
    requests = poisson_arrivals(bimodal_requests(llm.tokenizer, 6, seed=5, system_tokens=32),
                                rate=0.5, seed=5, unit="steps")
    fits = []                     # the CLI passes a function: a fit just before each workload
    reference = calibration_workloads(llm.tokenizer)[0]         # 3 long prompts, ~1.5 s
    report, numbers = validate(llm, lambda: fits.append(profile) or profile, {"small": requests},
                               reference=reference)
    assert len(fits) == 1
    assert "machine drift since the fit" in report and len(numbers["small"]["drift"]) == 2
    assert all(0.3 < d < 3 for d in numbers["small"]["drift"])   # the same machine, give or take
    assert "total, drift-corrected" in numbers["small"]
    assert f"fitted just before: {profile.source}: {fitted_terms(profile)}" in report
    assert "ms a step" in fitted_terms(profile) and "GFLOP/s" in fitted_terms(profile)
    kinds = numbers["small"]["steps"]
    assert {"decode", "prefill"} <= set(kinds) or {"decode", "mixed"} <= set(kinds)
    assert all(e["measured"] > 0 and e["predicted"] > 0 for e in kinds.values())
    assert all(f"{k.upper()} p{q}" in report for k in ("ttft", "e2e") for q in (50, 90))
    assert all(kind in report for kind in kinds)
    print(report)


def test_routing_policies_at_scale(capsys):
    """`minivllm simulate --compare-routing -dp 8` (docs/benchmarks.md): on eight simulated
    replicas, prefix-aware routing computes exactly each chat's first prompt and every later
    turn's new message; the score and round-robin compute more than twice that."""
    main(["simulate", "--compare-routing", "-dp", "8"])
    out = capsys.readouterr().out
    computed = {policy: int(n) for policy, n in re.findall(
        r"^(round_robin|score|prefix)\s+\d+\s+(\d+)", out, re.MULTILINE)}
    assert computed["prefix"] == 128 * (512 + 128) + 128 * 3 * 128, out
    assert min(computed["score"], computed["round_robin"]) > 2 * computed["prefix"], out
