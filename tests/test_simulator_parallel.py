"""Pipeline and data parallelism in the simulator (`simulate`'s pipeline_parallel_size and
data_parallel_size), checked against the real thing on this machine: the packaged model as two
pipeline stages and as two replicas, every rank on one thread (what a 2-core machine gives each
of two ranks), against a profile `calibrate` fitted on one thread.

Pipeline: the same schedule batch for batch (EngineCore.step_with_batch_queue drives both), the
same hidden-state messages and bytes between the stages, the last stage idle about as long,
and seconds within the simulator's bound. Data parallelism: the front end's balancer
(dp_client.load_score) sends each request to the same replica in both, each replica computes
the same tokens, and seconds are within the bound. (A real replica steps as soon as its first
request lands, so its first step races the front end's later sends: a replica's schedule is
compared by what it computed, not step by step; a run in which a replica began a step before
the last send may have balanced otherwise, so up to four run for one that balanced as
simulated, and a run that did not race must have.) Seconds cannot be judged on a machine
another job shares (one started beside this test slows both real repeats alike, and two ranks
on two cores lose half their speed): the CPU time other processes took during the real runs is
measured, and the seconds check skips when it passes 10% of the machine, or when the two real
repeats differ by more than 10%. The other counts are checked whatever the load.
"""

from __future__ import annotations

import time

import numpy as np
import psutil
import pytest
import torch

from minivllm import LLM
from minivllm.simulator.cli import real_latencies, schedule
from minivllm.simulator import simulate
from minivllm.simulator.calibrate import calibrate
from minivllm.workloads import lognormal_requests, poisson_arrivals, serve
from test_simulator import PREDICTION_BOUND

# Two replicas on one machine share its memory bandwidth and caches, which a fit taken with one
# engine alone does not see (each replica still has a core to itself: the front end used 0.04 s
# of CPU in a 3.8 s run): measured -9% to -18% (docs/benchmarks.md), so the check allows more
# than PREDICTION_BOUND there.
DP_BOUND = 0.30
SMALL = dict(max_model_len=256, num_kv_blocks=64, enable_prefix_caching=False,
             max_num_seqs=64, max_num_batched_tokens=2048)


@pytest.fixture(scope="module")
def one_thread():
    """This process on one thread while the module runs (the parallel engines built here give
    each rank one), and this machine's profile fitted on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        llm = LLM(max_model_len=512, enable_prefix_caching=False)
        yield llm.tokenizer, calibrate(llm, save=False)
    finally:
        torch.set_num_threads(before)


class ForeignLoad:
    """`with ForeignLoad() as load:` ... `load.share`: the CPU time processes outside this one
    and its children took inside the block, and the time the hypervisor gave this VM's cores to
    others (steal), as a share of every core's time."""

    def __enter__(self):
        self.me = psutil.Process()
        self.t0, self.busy0, self.mine0 = time.perf_counter(), self._busy(), self._mine()
        return self

    def _busy(self) -> float:
        t = psutil.cpu_times()
        return (t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0)
                + getattr(t, "steal", 0))

    def _mine(self) -> dict[int, float]:
        out = {}
        for p in [self.me, *self.me.children(recursive=True)]:
            try:
                c = p.cpu_times()
                out[p.pid] = c.user + c.system
            except psutil.Error:
                pass
        return out

    def __exit__(self, *exc):
        mine = self._mine()
        used = sum(t - self.mine0.get(pid, 0.0) for pid, t in mine.items())
        wall = (time.perf_counter() - self.t0) * psutil.cpu_count()
        self.share = max(0.0, self._busy() - self.busy0 - used) / wall


def workload(tokenizer, arrivals_in_steps: bool):
    requests = lognormal_requests(tokenizer, 12, prompt=(4.5, 0.6, 16, 200),
                                  output=(2.8, 0.4, 6, 24), seed=41)
    return poisson_arrivals(requests, 0.5, seed=41, unit="steps") if arrivals_in_steps else requests


def judge(name: str, real: list[dict], sim: dict, foreign: float,
          bound: float = PREDICTION_BOUND) -> None:
    """Print each number simulated against two real runs; skip if the runs disagree by more
    than 10% or other processes took more than 10% of the CPU meanwhile, else assert every
    error is under `bound`."""
    lines, errors = [], {}
    for key in sim:
        measured = float(np.mean([r[key] for r in real]))
        errors[key] = sim[key] / measured - 1
        lines.append(f"{name} {key}: simulated {sim[key]:.3f} s, real {real[0][key]:.3f} / "
                     f"{real[1][key]:.3f} s: error {errors[key]:+.1%}")
    print("\n".join(lines))
    print(f"other processes (and the hypervisor) took {foreign:.0%} of the CPU during the "
          "real runs")
    spread = abs(real[0]["total"] - real[1]["total"]) / np.mean([r["total"] for r in real])
    if spread > 0.10 or foreign > 0.10:
        pytest.skip(f"real runs {spread:.0%} apart, {foreign:.0%} of the CPU taken by other "
                    "processes: too loaded to judge seconds; " + "; ".join(lines))
    bad = {k: e for k, e in errors.items() if abs(e) >= bound}
    assert not bad, "\n".join(lines)


def test_pipeline_parallel_simulated_as_it_runs(one_thread):
    tokenizer, profile = one_thread
    llm = LLM(pipeline_parallel_size=2, **SMALL)
    try:
        group = llm.engine.model_executor.pp            # the driver's end: the last stage
        runs = []
        with ForeignLoad() as load:
            for _ in range(2):
                recvs, received = group.num_recvs, group.recv_bytes
                waited = group.recv_wait_seconds
                runs.append((serve(llm, workload(tokenizer, True)), group.num_recvs - recvs,
                             group.recv_bytes - received, group.recv_wait_seconds - waited))
    finally:
        llm.engine.shutdown()
    sim = simulate(workload(tokenizer, True), model=llm.engine.model_config.hf_config,
                   profile=profile, pipeline_parallel_size=2, **SMALL)
    real, num_recvs, recv_bytes, _ = runs[0]
    assert schedule(sim.steps) == schedule(real.steps)       # batch for batch
    executor = sim.executors["engine-0"]
    assert (executor.num_sends, executor.send_bytes) == (num_recvs, recv_bytes)
    idle = sim.elapsed - executor.busy[-1]                    # the last stage, waiting
    print(f"last stage idle: simulated {idle:.2f} s, real {runs[0][3]:.2f} / {runs[1][3]:.2f} s")

    def numbers(total, e2e):
        return {"total": total, "E2E p50": float(np.percentile(e2e, 50)),
                "E2E p90": float(np.percentile(e2e, 90))}
    judge("PP=2", [numbers(r.elapsed, real_latencies(r)["e2e"]) for r, *_ in runs],
          numbers(sim.elapsed, sim.e2e), load.share)


def test_data_parallel_simulated_behind_the_same_balancer(one_thread):
    tokenizer, profile = one_thread
    llm = LLM(data_parallel_size=2, **SMALL)

    def real_run():
        """(its steps, when the first request was sent, when the last was, the outputs)."""
        requests = workload(tokenizer, False)
        t0 = time.perf_counter()
        with llm.engine.trace() as steps:
            for i, r in enumerate(requests):
                llm.engine.add_request(f"req-{i}", list(r.prompt), r.params)
            sent = time.perf_counter()
            done = {}
            while llm.engine.has_unfinished_requests():
                done.update({o.request_id: o for o in llm.engine.step() if o.finished})
        return steps, t0, sent, [done[f"req-{i}"] for i in range(len(requests))]

    try:
        with ForeignLoad() as load:
            runs = [real_run(), real_run()]
        sim = simulate(workload(tokenizer, False), model=llm.engine.model_config.hf_config,
                       profile=profile, data_parallel_size=2, **SMALL)
        replica = {s.request_id: name for name, steps in sim.engine_steps.items()
                   for st in steps for s in st.scheduled}
        assert sorted(set(replica.values())) == ["engine-0", "engine-1"]

        def computed(steps) -> dict[str, tuple] | None:
            """Per replica: its requests, the prompt and decode tokens it computed (None: a
            real step held requests the simulated balancer sent to different replicas)."""
            out: dict[str, list] = {}
            for st in steps:
                owners = {replica[s.request_id] for s in st.scheduled}
                if len(owners) > 1:
                    return None
                e = out.setdefault(owners.pop(), [set(), 0, 0])
                e[0].update(s.request_id for s in st.scheduled)
                e[1] += st.num_prefill_tokens
                e[2] += st.num_decode_tokens
            return {k: (sorted(v[0]), v[1], v[2]) for k, v in out.items()}
        # The real front end reads each replica's stats as they stream back: a replica that
        # schedules its first step while requests are still being sent (about 2 ms for the 12
        # here) shows one running, not waiting, and changes the scores the rest see: a race
        # the simulator, which steps only once all have arrived, never runs (vLLM's balancer
        # has it too). A run with no step begun before its last send cannot have raced, and
        # must balance as the simulator did; so must one run of up to four, or the machine is
        # too loaded to tell (CI saw both timed runs race and differ once).
        simulated = computed(sim.steps)

        def balanced(steps, sent) -> tuple[bool, bool]:
            """(balanced as simulated, raced: a step began before the last send)."""
            return computed(steps) == simulated, any(st.start_time < sent for st in steps)

        balance = [balanced(steps, sent) for steps, _, sent, _ in runs]
        while not any(same for same, _ in balance) and len(balance) < 4:
            steps, _, sent, _ = real_run()
            balance.append(balanced(steps, sent))
    finally:
        llm.engine.shutdown()
    print("DP=2 balanced as simulated (raced: a step began before the last send): "
          + ", ".join(f"{same} (raced: {raced})" for same, raced in balance))
    assert all(same or raced for same, raced in balance)
    if not any(same for same, _ in balance):
        pytest.skip("every real run raced its own sends (a machine too loaded to check the "
                    "balancer against the simulator)")

    def numbers(outputs, t0):
        e2e = [o.metrics.finished_time - t0 for o in outputs]
        return {"total": max(e2e), "E2E p50": float(np.percentile(e2e, 50)),
                "E2E p90": float(np.percentile(e2e, 90))}
    judge("DP=2", [numbers(outputs, t0) for _, t0, _, outputs in runs],
          {"total": sim.elapsed, "E2E p50": float(np.percentile(sim.e2e, 50)),
           "E2E p90": float(np.percentile(sim.e2e, 90))}, load.share, DP_BOUND)
