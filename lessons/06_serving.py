import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import asyncio
    import concurrent.futures
    import time

    import marimo as mo
    import matplotlib.pyplot as plt
    import numpy as np
    import torch

    from minivllm import LLM, SamplingParams
    from minivllm.engine.async_llm_engine import AsyncLLMEngine
    from minivllm.benchmarks.serve import make_prompts, run_load, summarize
    from minivllm.entrypoints.openai.api_server import Server, bind_socket
    from minivllm.platforms import release_openmp_threads
    from minivllm.workloads import Request, poisson_arrivals, serve
    return (AsyncLLMEngine, LLM, Request, SamplingParams, Server, asyncio, bind_socket,
            concurrent, make_prompts, mo, np, plt, poisson_arrivals, release_openmp_threads,
            run_load, serve, summarize, time, torch)


@app.cell
def _(mo):
    mo.md(r"""
    # 06 · Serving: from an HTTP request to tokens, many users at once

    After this lesson you can draw the path of a request through an OpenAI-compatible server,
    say why the engine's step loop must not run inside the web server's event loop (and
    measure what happens if it does), predict from one number, the engine's step time, the
    request rate at which a server saturates, and recognize saturation in a load test: the
    knee after which throughput stops growing and time to first token grows without bound.

    *Terms: TTFT, ITL, E2E latency, throughput and goodput are defined once for the course,
    in seconds and in engine steps, on the Glossary page (docs/glossary.md).*
    """)
    return


@app.cell
def _(LLM, mo, torch):
    # One engine for the whole lesson. Few slots on purpose: the server saturates at a rate a
    # CPU can reach in seconds.
    MAX_NUM_SEQS, OUTPUT_LEN = 4, 8
    llm = LLM(max_model_len=256, max_num_seqs=MAX_NUM_SEQS)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    mo.md(f"**running on:** {device} · **model:** SmolLM2-135M-Instruct "
          f"({str(llm.engine.dtype).removeprefix('torch.')}) · **max_num_seqs:** "
          f"{MAX_NUM_SEQS}  \n`{llm.engine!r}`")
    return MAX_NUM_SEQS, OUTPUT_LEN, device, llm


@app.cell
def _(mo):
    mo.md(r"""
    ## The path of a request

    ```
     client ──HTTP──▶ uvicorn / FastAPI handler (a coroutine on the event loop)
                        │ validate (pydantic, SamplingParams), tokenize, check max_model_len
                        ▼
                      command queue ──▶ engine thread: drain commands, step(), step(), ...
                                                       │ one RequestOutput per request per step
     client ◀──SSE── stream per request ◀── loop.call_soon_threadsafe(queue.put_nowait, out)
    ```

    The event loop does the waiting: thousands of connections, each mostly idle, cost it
    nothing while they wait. The engine does the work: one `step()` is a forward pass over the
    whole batch. They meet at two queues: commands in (add, abort), outputs out. A client that
    disconnects becomes an `abort` command; the engine thread applies it before its next
    step, so the request's KV blocks are free again within one step
    (`minivllm/engine/async_llm_engine.py`, `minivllm/entrypoints/openai/serving.py`).
    """)
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## The problem, measured: an engine inside the event loop

    The obvious server calls `engine.step()` from a coroutine. Below, a deliberately naive
    loop does that (labelled as such: it is not how minivllm serves) while a second
    coroutine, a *ticker*, only wants to wake up every 5 ms, as a server wants to accept a
    connection or flush a token. Then the same requests go through `AsyncLLMEngine`, whose
    step loop runs on its own thread, with the same ticker. We count the ticker's wake-ups
    per engine step: a count, not a time, so a busy machine does not flip the result.
    """)
    return


@app.cell
def _(
    AsyncLLMEngine,
    SamplingParams,
    asyncio,
    concurrent,
    llm,
    np,
    release_openmp_threads,
    time,
):
    def in_fresh_loop(coro_fn):
        """Run an async function on its own event loop (a notebook may already run one)."""
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(lambda: asyncio.run(coro_fn())).result()

    async def ticker(stop, period=0.005):
        ticks, worst = 0, 0.0
        while not stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(period)
            worst = max(worst, time.perf_counter() - t0 - period)
            ticks += 1
        return ticks, worst

    _greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    _prompts = [f"Request {i}: tell me about rivers." for i in range(8)]
    llm.generate(_prompts[:2], _greedy, use_tqdm=False)          # warm-up

    async def inline():                                          # NAIVE: for contrast only
        engine, stop = llm.engine, asyncio.Event()
        tick = asyncio.create_task(ticker(stop))
        for i, p in enumerate(_prompts):
            engine.add_request(f"inline-{i}", p, _greedy)
        step_s = []
        while engine.has_unfinished_requests():
            t0 = time.perf_counter()
            engine.step()                  # the whole forward pass, with the loop frozen
            step_s.append(time.perf_counter() - t0)
            await asyncio.sleep(0)         # the loop runs only here, between steps
        stop.set()
        return step_s, *(await tick)

    # The model runs on in_fresh_loop's thread now, and then on AsyncLLMEngine's: this
    # thread's OpenMP workers go (two teams on a small CPU sleep and wake at every kernel:
    # AsyncLLMEngine does this itself, minivllm/platforms.py).
    release_openmp_threads()
    inline_step_s, inline_ticks, inline_worst = in_fresh_loop(inline)
    num_steps = len(inline_step_s)

    # From here on the engine belongs to its AsyncLLMEngine thread (and later the server).
    aengine = AsyncLLMEngine(llm.engine)

    async def threaded():
        stop = asyncio.Event()
        tick = asyncio.create_task(ticker(stop))
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(
            _last(aengine.generate(p, _greedy, f"threaded-{i}")) for i, p in enumerate(_prompts)))
        wall = time.perf_counter() - t0
        stop.set()
        return outs, wall, *(await tick)

    async def _last(stream):
        async for out in stream:
            last = out
        return last

    _outs, threaded_wall, threaded_ticks, threaded_worst = in_fresh_loop(threaded)
    step_s = float(np.median(inline_step_s))
    print(f"{num_steps} engine steps, median {step_s * 1000:.0f} ms each. Ticker wake-ups: "
          f"engine in the loop {inline_ticks} ({inline_ticks / num_steps:.1f} per step, worst "
          f"delay {inline_worst * 1000:.0f} ms); engine on its thread {threaded_ticks} "
          f"({threaded_ticks / num_steps:.1f} per step, worst delay "
          f"{threaded_worst * 1000:.0f} ms)")
    return (aengine, in_fresh_loop, inline_ticks, inline_worst, num_steps, step_s,
            threaded_ticks, threaded_worst)


@app.cell
def _(inline_ticks, inline_worst, mo, num_steps, step_s, threaded_ticks, threaded_worst):
    mo.md(f"""
    With the engine inside the loop, the ticker woke up **{inline_ticks / num_steps:.1f}**
    times per step: only in the gaps between steps, and its worst wait was
    {inline_worst * 1000:.0f} ms, about one step ({step_s * 1000:.0f} ms median). A server built
    that way accepts no connection and sends no token while the model runs. With the step
    loop on its own thread, the ticker woke up **{threaded_ticks / num_steps:.1f}** times per
    step (worst wait {threaded_worst * 1000:.0f} ms): torch releases Python's global lock
    inside its kernels, so the event loop runs *during* the forward pass.

    Why a thread and not a process: one process keeps one copy of the weights and the KV
    cache, and outputs cross over as Python objects. vLLM V1 puts its `EngineCore` (scheduler,
    model runner, sampler) in a process of its own, which frees the core's Python from the
    lock the server holds, at the price of serializing every request and output over a
    socket. Detokenizing stays in the front-end process, in V1 as here: V1's
    `OutputProcessor` turns the core's token ids into text beside the HTTP handlers, and so
    does minivllm's (`minivllm/engine/output_processor.py`), on this engine thread.
    `minivllm serve` moves the core to its own process too (`minivllm/engine/multiproc/`).

    A thread has one more cost on a CPU. torch's kernels run on a team of OpenMP threads, one
    team for each thread that runs them: the engine built here on the notebook's thread and
    stepped on the engine thread would keep two. With more of those threads than cores,
    OpenMP stops spinning between kernels and puts its workers to sleep after every one,
    about a thousand wake-ups a step; on a 2-core machine the in-process server's steps ran
    35-60% slower. So `AsyncLLMEngine` hands the building thread's team back when it starts,
    and its own whenever it waits for work (`minivllm/platforms.py`,
    `release_openmp_threads`), as this notebook does before its naive loop. A core in its own
    process builds and steps on one thread, and never has the problem.
    """)
    return


@app.cell
def _(MAX_NUM_SEQS, OUTPUT_LEN, Server, aengine, bind_socket, mo, step_s):
    server = Server(aengine, bind_socket("127.0.0.1", 0), "smol").start()
    # The measured step time, with every slot busy decoding, bounds what the server can do:
    # MAX_NUM_SEQS requests advance one token per step, and each needs OUTPUT_LEN of them.
    capacity_rps = MAX_NUM_SEQS / (OUTPUT_LEN * step_s)
    mo.md(f"""
    ## A load test on the real server

    A real server now runs on {server.url} (uvicorn on a thread of this notebook), over the
    same engine. Requests arrive open-loop, as users do: Poisson arrivals at a set rate,
    whatever the server is doing (`minivllm bench serve`'s generator, called from Python).
    Each asks for {OUTPUT_LEN} tokens, streamed. With {MAX_NUM_SEQS} slots and
    {step_s * 1000:.0f} ms per step, the engine can finish at most about
    **{capacity_rps:.2f} requests/s**: that is our prediction of the knee.
    """)
    return capacity_rps, server


@app.cell
def _(
    OUTPUT_LEN,
    aengine,
    asyncio,
    in_fresh_loop,
    make_prompts,
    mo,
    run_load,
    server,
    summarize,
    time,
):
    _headless = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    NUM_REQUESTS = 12 if _headless else 24

    def load_test(rate, seed=0):
        """Serve NUM_REQUESTS streamed requests arriving at `rate`/s; sample the queue."""
        prompts = make_prompts(NUM_REQUESTS, 16, seed)
        print(f"load test: {NUM_REQUESTS} requests at {rate:.2f} req/s ...", flush=True)
        samples = []

        async def main():
            stop = asyncio.Event()

            async def sample():
                t0 = time.perf_counter()
                while not stop.is_set():
                    s = aengine.stats()
                    samples.append((time.perf_counter() - t0, s.num_running, s.num_waiting))
                    await asyncio.sleep(0.05)
            sampler = asyncio.create_task(sample())
            results, duration = await run_load(server.url, "smol", prompts, OUTPUT_LEN, rate,
                                               seed, progress=False)
            stop.set()
            await sampler
            return results, duration
        results, duration = in_fresh_loop(main)
        report = summarize(results, duration, rate)
        report["queue"] = samples
        report["max_waiting"] = max(w for _, _, w in samples)
        report["ttft_by_arrival_s"] = [r.ttft for r in results]
        return report
    return NUM_REQUESTS, load_test


@app.cell
def _(NUM_REQUESTS, capacity_rps, load_test, mo, plt):
    RATE_FACTORS = (0.4, 1.0, 3.0)
    sweep = {_f: load_test(_f * capacity_rps) for _f in RATE_FACTORS}
    _fig, (_a, _b, _c) = plt.subplots(1, 3, figsize=(12, 3.3))
    _rates = [sweep[_f]["request_rate"] for _f in RATE_FACTORS]
    _a.plot(_rates, [sweep[_f]["output_throughput"] for _f in RATE_FACTORS], "o-")
    _a.set_xlabel("request rate, req/s")
    _a.set_ylabel("output tokens/s")
    _a.axvline(capacity_rps, color="k", ls="--", lw=1, label="predicted knee")
    _a.legend(fontsize=8)
    for _k, _col in (("median", "tab:blue"), ("p99", "tab:red")):
        _b.plot(_rates, [sweep[_f][f"{_k}_ttft_ms"] for _f in RATE_FACTORS], "o-", color=_col,
                label=f"TTFT {_k}")
        _b.plot(_rates, [sweep[_f][f"{_k}_itl_ms"] for _f in RATE_FACTORS], "s--", color=_col,
                label=f"ITL {_k}")
    _b.set_xlabel("request rate, req/s")
    _b.set_ylabel("ms")
    _b.legend(fontsize=7)
    for _f in RATE_FACTORS:
        _q = sweep[_f]["queue"]
        _c.plot([t for t, _, _ in _q], [w for _, _, w in _q], label=f"{_f}x the knee")
    _c.set_xlabel("seconds into the test")
    _c.set_ylabel("requests waiting")
    _c.legend(fontsize=8)
    _fig.tight_layout()
    for _f in RATE_FACTORS:
        _r = sweep[_f]
        print(f"rate {_r['request_rate']:5.2f} req/s ({_f}x predicted knee): "
              f"{_r['completed']}/{NUM_REQUESTS} done, {_r['output_throughput']:6.1f} tok/s, "
              f"TTFT p50 {_r['median_ttft_ms']:7.0f} ms p99 {_r['p99_ttft_ms']:7.0f} ms, ITL "
              f"p50 {_r['median_itl_ms']:5.0f} ms, most waiting {_r['max_waiting']}")
    _fig
    return RATE_FACTORS, sweep


@app.cell
def _(NUM_REQUESTS, RATE_FACTORS, mo, sweep):
    _lo, _hi = sweep[RATE_FACTORS[0]], sweep[RATE_FACTORS[-1]]
    mo.md(f"""
    Below the knee, a request usually finds a free slot: at most {_lo['max_waiting']} waited
    at once, and its TTFT is mostly its prefill ({_lo['median_ttft_ms']:.0f} ms median); the
    server's throughput simply follows the arrival rate, because it is waiting for work.
    Past the knee, requests arrive faster than slots free up and a queue forms (up to
    {_hi['max_waiting']} waiting), so TTFT now includes time spent queueing, not computing
    (p99 {_hi['p99_ttft_ms']:.0f} ms against {_lo['p99_ttft_ms']:.0f} ms). With only
    {NUM_REQUESTS} requests the burst is short and the queue drains when it ends; under a
    sustained load above the knee it would grow for as long as the load lasts. The seconds
    come from this machine (shared, when the lesson was recorded); the queue lengths are
    counts.
    """)
    return


@app.cell
def _(MAX_NUM_SEQS, OUTPUT_LEN, mo):
    # Headless, the right answer is filled in so that the checker's verdict is tested below.
    _headless = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    knee_guess = mo.ui.number(start=0, stop=100, step=0.005,
                              value=MAX_NUM_SEQS / OUTPUT_LEN if _headless else 0,
                              label="requests finished per engine step, at most")
    mo.vstack([mo.md(f"""
    ## Predict, then the engine checks: the knee in steps

    Before the next run: an engine with **{MAX_NUM_SEQS}** slots (`max_num_seqs`) is handed
    far more requests than it can hold, each asking for **{OUTPUT_LEN}** tokens. Once it is
    saturated, how many requests does it finish **per engine step**, on average? That rate is
    the knee: arrivals faster than it must queue. Write a number; the engine then serves a
    saturating burst and its own count (requests finished / steps) decides.
    """), knee_guess])
    return (knee_guess,)


@app.cell
def _(mo):
    mo.md(r"""
    ## The same knee, counted in engine steps

    The seconds above belong to this machine, and they move when it is busy: the knee in
    requests per second is the step time's shadow. The knee itself is a count. In a step, a
    full batch advances each of its `MAX_NUM_SEQS` requests by one token (a request's
    prefill step gives its first one), so a request holds a slot for `OUTPUT_LEN` steps and
    the engine finishes at most

    $$\text{knee} = \frac{\texttt{MAX\_NUM\_SEQS}}{\texttt{OUTPUT\_LEN}}
    \ \text{requests per step}.$$

    Below, a second engine of the same shape (the first now belongs to the server's thread)
    is driven step by step with `add_request` and `step` (`minivllm.workloads.serve`), with
    Poisson arrivals counted in steps, at multiples of that knee. After each step we read
    how many requests wait for a slot. Nothing here is timed, so a loaded machine gives the
    same queue.
    """)
    return


@app.cell
def _(LLM, MAX_NUM_SEQS, OUTPUT_LEN, Request, SamplingParams, make_prompts, mo, np,
      poisson_arrivals, serve):
    STEP_FACTORS, STEP_REQUESTS = (0.5, 0.8, 1.25, 2.0), 40
    knee_per_step = MAX_NUM_SEQS / OUTPUT_LEN
    step_llm = LLM(max_model_len=256, max_num_seqs=MAX_NUM_SEQS)

    def queue_in_steps(factor, seed=0):
        """Waiting requests after each step, for arrivals at factor x the knee."""
        params = SamplingParams(temperature=0, max_tokens=OUTPUT_LEN, ignore_eos=True)
        reqs = poisson_arrivals([Request(p, params) for p in make_prompts(STEP_REQUESTS, 16, seed)],
                                factor * knee_per_step, seed=seed, unit="steps")
        print(f"engine steps: {STEP_REQUESTS} requests at {factor}x the knee ...", flush=True)
        run = serve(step_llm, reqs)
        waiting = [s.stats.num_waiting for s in run.steps]
        arrivals = waiting[:max(run.arrival_step) + 1]   # while requests still arrive
        half = len(arrivals) // 2
        return {"waiting": waiting, "steps": len(waiting),
                "mean_waiting": float(np.mean(arrivals)),
                "first_half": float(np.mean(arrivals[:half])),
                "second_half": float(np.mean(arrivals[half:])),
                "done": sum(o.finished for o in run.outputs)}

    # Saturated: every request arrives at step 0, so a slot never waits for work; the engine's
    # finishing rate is then its capacity, counted in steps.
    _params = SamplingParams(temperature=0, max_tokens=OUTPUT_LEN, ignore_eos=True)
    print(f"engine steps: {STEP_REQUESTS} requests at once (saturated) ...", flush=True)
    _sat = serve(step_llm, [Request(p, _params) for p in make_prompts(STEP_REQUESTS, 16, 0)])
    saturated = {"done": sum(len(_s.finished) for _s in _sat.steps), "steps": len(_sat.steps)}
    saturated["per_step"] = saturated["done"] / saturated["steps"]

    def check_knee_guess(value):
        """The learner's knee (requests per step) against the saturated engine's count."""
        rate = saturated["per_step"]
        if not value:
            return "Enter a number of requests per step."
        if abs(value / rate - 1) <= 0.1:
            return (f"Correct: saturated, the engine finished {saturated['done']} requests in "
                    f"{saturated['steps']} steps, {rate:.3f} per step. Each slot holds a "
                    f"request for {OUTPUT_LEN} steps, so {MAX_NUM_SEQS} slots finish "
                    f"{MAX_NUM_SEQS} requests every {OUTPUT_LEN} steps.")
        if abs(value - MAX_NUM_SEQS) < 1e-9:
            return (f"That is tokens per step ({MAX_NUM_SEQS} slots, a token each). A request "
                    f"needs {OUTPUT_LEN} of them: the engine finished {rate:.3f} per step.")
        if abs(value * rate - 1) <= 0.1:
            return (f"Upside down: that is steps per request. The engine finished "
                    f"{rate:.3f} requests per step.")
        return (f"{'Too high' if value > rate else 'Too low'}: the engine finished "
                f"{saturated['done']} requests in {saturated['steps']} steps, {rate:.3f} per "
                "step.")

    step_sweep = {_f: queue_in_steps(_f) for _f in STEP_FACTORS}
    for _f, _q in step_sweep.items():
        print(f"{_f}x the knee ({_f * knee_per_step:.2f} req/step): {_q['steps']} steps, "
              f"mean waiting while requests arrive {_q['mean_waiting']:.2f} (first half "
              f"{_q['first_half']:.2f}, second half {_q['second_half']:.2f}), "
              f"most {max(_q['waiting'])}")
    mo.md(f"knee: {MAX_NUM_SEQS} slots / {OUTPUT_LEN} tokens = **{knee_per_step} requests "
          f"per step**; the saturated engine counted **{saturated['per_step']:.3f}** "
          f"({saturated['done']} requests in {saturated['steps']} steps)")
    return (STEP_FACTORS, STEP_REQUESTS, check_knee_guess, knee_per_step, saturated,
            step_sweep)


@app.cell
def _(check_knee_guess, knee_guess, mo):
    _msg = check_knee_guess(knee_guess.value)
    mo.callout(mo.md(f"Your prediction: **{knee_guess.value:g}** requests per step. {_msg}"),
               kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(STEP_FACTORS, knee_per_step, mo, plt, step_sweep):
    _fig, _ax = plt.subplots(figsize=(7, 2.8))
    for _f in STEP_FACTORS:
        _ax.plot(step_sweep[_f]["waiting"], label=f"{_f}x ({_f * knee_per_step:.2f} req/step)")
    _ax.set_xlabel("engine step")
    _ax.set_ylabel("requests waiting")
    _ax.legend(fontsize=8)
    _fig.tight_layout()
    _lo = max(_f for _f in STEP_FACTORS if _f < 1)
    _hi = min(_f for _f in STEP_FACTORS if _f > 1)
    mo.vstack([_fig, mo.md(f"""
    At {_lo}x the knee, on average **{step_sweep[_lo]['mean_waiting']:.2f}** requests waited
    while requests arrived: a slot is usually free. At {_hi}x, **{step_sweep[_hi]['mean_waiting']:.2f}**,
    and the queue grows as the load lasts ({step_sweep[_hi]['first_half']:.2f} in the first
    half of the arrivals, {step_sweep[_hi]['second_half']:.2f} in the second): the onset lies
    between {_lo}x and {_hi}x, where the formula put it. Short of the knee the queue is not
    quite empty: Poisson arrivals bunch, and a burst waits a few steps for slots.
    """)])
    return


@app.cell
def _(capacity_rps, mo):
    rate = mo.ui.slider(0.2, 5.0, step=0.2, value=2.0, show_value=True,
                        label="request rate, x the predicted knee")
    mo.md(f"""
    ### Try it: push the server over the knee

    Pick a request rate as a multiple of the predicted knee ({capacity_rps:.2f} req/s). Each
    dot below is one request: its TTFT against its arrival order. Under the
    knee the dots lie flat; over it they climb, each request waiting for all the ones before
    it. Where does the line start to climb?

    {rate}
    """)
    return (rate,)


@app.cell
def _(capacity_rps, load_test, mo, plt, rate):
    _r = load_test(rate.value * capacity_rps, seed=1)
    _fig, _ax = plt.subplots(figsize=(7, 2.8))
    _ax.plot([t * 1000 for t in _r["ttft_by_arrival_s"]], "o")
    _ax.set_xlabel("request, in arrival order")
    _ax.set_ylabel("TTFT, ms")
    _ax.set_ylim(bottom=0)
    _fig.tight_layout()
    mo.vstack([_fig, mo.md(f"{rate.value}x the knee: {_r['output_throughput']:.1f} tok/s, "
                           f"TTFT p99 {_r['p99_ttft_ms']:.0f} ms, at most "
                           f"{_r['max_waiting']} requests waiting.")])
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Exercise: predict the knee

    Write `saturation_rate(step_s, max_num_seqs, output_len)`: the request rate (requests per
    second) above which the queue must grow, for requests that each want `output_len` tokens,
    on an engine that runs `max_num_seqs` sequences per step of `step_s` seconds. Ignore the
    prefill (it shares steps with decodes). Hint: in one second, how many tokens can the
    engine produce, and how many does one request need?
    """)
    return


@app.function
def saturation_rate(step_s, max_num_seqs, output_len):
    # Your answer here: return a number of requests per second.
    return None


@app.cell
def _(mo):
    def check_saturation_rate(fn):
        cases = [(0.1, 4, 8, 5.0), (0.05, 64, 128, 10.0), (0.02, 256, 256, 50.0)]
        for step, seqs, out, truth in cases:
            got = fn(step, seqs, out)
            if got is None:
                return "not answered yet: saturation_rate returns None"
            if abs(got - truth) > 1e-6 * truth:
                if abs(got - truth * out) < 1e-6 * truth * out:
                    return (f"{got:g} for {(step, seqs, out)} is tokens per second; divide "
                            "by the tokens one request needs")
                return f"saturation_rate{(step, seqs, out)} = {got:g}; expected {truth:g}"
        return "correct: max_num_seqs / (step_s x output_len)"
    mo.md(f"**checker:** {check_saturation_rate(saturation_rate)}")
    return (check_saturation_rate,)


@app.cell
def _(
    MAX_NUM_SEQS,
    NUM_REQUESTS,
    RATE_FACTORS,
    STEP_FACTORS,
    STEP_REQUESTS,
    aengine,
    check_knee_guess,
    check_saturation_rate,
    inline_ticks,
    knee_guess,
    knee_per_step,
    num_steps,
    saturated,
    step_sweep,
    sweep,
    threaded_ticks,
):
    def test_the_event_loop_runs_during_a_step_only_with_the_thread():
        assert inline_ticks <= num_steps + 2           # only between steps
        assert threaded_ticks > 2 * inline_ticks

    def test_every_request_served_and_no_block_left():
        assert all(r["completed"] == NUM_REQUESTS and r["failed"] == 0
                   for r in sweep.values())
        s = aengine.stats()
        assert (s.num_running, s.num_waiting, s.num_blocks_used) == (0, 0, 0)

    def test_the_queue_grows_only_past_the_knee():
        # The server's rates were set from knee_per_step / step_s. The seconds half moves with
        # the machine; the count half must hold: saturated, the engine finishes within 10% of
        # knee_per_step requests per step, so a knee mispredicted 2x (either way) fails here.
        assert saturated["done"] == STEP_REQUESTS
        assert abs(saturated["per_step"] / knee_per_step - 1) <= 0.1
        lo, hi = sweep[RATE_FACTORS[0]], sweep[RATE_FACTORS[-1]]
        assert hi["max_waiting"] > lo["max_waiting"]
        assert hi["max_waiting"] >= MAX_NUM_SEQS // 2

    def test_the_queue_starts_at_the_knee_in_steps():
        below = [f for f in STEP_FACTORS if f < 1]
        past = [f for f in STEP_FACTORS if f > 1]
        assert all(q["done"] == STEP_REQUESTS for q in step_sweep.values())
        # Below the knee, on average less than one request waits for a slot ...
        assert all(step_sweep[f]["mean_waiting"] < 1 for f in below)
        # ... past it, more than one, and more in the second half of the arrivals than the first.
        assert all(step_sweep[f]["mean_waiting"] >= 1 for f in past)
        assert all(step_sweep[f]["second_half"] > step_sweep[f]["first_half"] + 1 for f in past)

    def test_exercise_checker():
        assert check_saturation_rate(lambda s, n, o: n / (s * o)).startswith("correct")
        assert "tokens per second" in check_saturation_rate(lambda s, n, o: n / s)
        assert "not answered" in check_saturation_rate(lambda s, n, o: None)

    def test_the_engine_checks_the_knee_prediction():
        # The headless run answered MAX_NUM_SEQS / OUTPUT_LEN; the saturated engine's count
        # decides, and a knee off by 2x either way is turned down.
        assert check_knee_guess(knee_guess.value).startswith("Correct")
        assert not check_knee_guess(2 * knee_guess.value).startswith("Correct")
        assert not check_knee_guess(knee_guess.value / 2).startswith("Correct")
        assert check_knee_guess(MAX_NUM_SEQS).startswith("That is tokens per step")
    return


@app.cell
def _(mo):
    # Shown at the end, under "Where the code lives".
    v1_box = mo.callout(mo.md(r"""
    **In vLLM V1** (as of vLLM 0.33). `vllm serve` starts the HTTP server from
    `vllm/entrypoints/launchers/api_server/` (`run_server` in `entry.py`, the routes wired up
    by `register_api_routers` in `routers.py`); the old `vllm/entrypoints/openai/api_server.py`
    is now only a deprecated shim that re-exports them. Each OpenAI endpoint has a folder of
    its own under `vllm/entrypoints/openai/`: completions is `OpenAIServingCompletion` in
    `completion/serving.py`, with its route in `completion/api_router.py` (chat sits in
    `chat_completion/`). The handlers hand requests to `AsyncLLM`
    (`vllm/v1/engine/async_llm.py`): `generate` yields one stream per request, and its
    `output_handler` task reads the core's `EngineCoreOutputs` through `AsyncMPClient`
    (`vllm/v1/engine/core_client.py`, ZMQ sockets) and passes them to
    `OutputProcessor.process_outputs` (`vllm/v1/engine/output_processor.py`, detokenizing
    with `vllm/v1/engine/detokenizer.py`) in the front-end process. The core runs
    `EngineCoreProc.run_busy_loop` (`vllm/v1/engine/core.py`) in its own process: drain the
    input queue, take one step, send outputs. With async scheduling, on by default where the
    setup allows it, that step is `step_with_batch_queue`, which schedules the next batch
    while the current one is still running on the GPU; otherwise it is plain `step`.
    minivllm splits the same way (AsyncLLMEngine's queues, LLMEngine's OutputProcessor, the
    EngineCore behind a client) but by default keeps the core on a thread of the same
    process, and steps one batch at a time unless its own `async_scheduling` option (off by
    default) is set: one copy of everything and no serialization, which a lesson can step
    and look into; `minivllm serve` uses the process split
    (`minivllm/engine/multiproc/`), as V1's `AsyncLLM` always does.
    """), kind="info")
    return (v1_box,)


@app.cell
def _(
    RATE_FACTORS,
    capacity_rps,
    inline_ticks,
    knee_per_step,
    mo,
    num_steps,
    step_s,
    step_sweep,
    sweep,
    threaded_ticks,
    v1_box,
):
    findings = {
        "step_ms": step_s * 1000,
        "ticks_per_step_inline": inline_ticks / num_steps,
        "ticks_per_step_threaded": threaded_ticks / num_steps,
        "predicted_knee_rps": capacity_rps,
        "by_rate": {f"{_f}x": {k: sweep[_f][k] for k in (
            "request_rate", "output_throughput", "median_ttft_ms", "p99_ttft_ms",
            "median_itl_ms", "p99_itl_ms", "max_waiting")} for _f in RATE_FACTORS},
        "predicted_knee_per_step": knee_per_step,
        "mean_waiting_by_step_rate": {f"{_f}x": round(_q["mean_waiting"], 2)
                                      for _f, _q in step_sweep.items()},
    }
    print("findings:", findings)
    mo.vstack([mo.md(r"""
    ## What we found

    * An engine stepping inside the event loop freezes the server for a whole forward pass;
      on its own thread, the loop keeps running during the step (the ticker counts above).
    * One measured number, the step time at a full batch, predicts the request rate where
      the server saturates. Past it, the waiting queue forms, and TTFT grows with it:
      latency is what pays for load beyond the knee.
    * Counted in engine steps, the knee is `MAX_NUM_SEQS / OUTPUT_LEN` requests per step on
      any machine: below it less than one request waited on average, past it the queue grew
      (the mean waiting per step by arrival rate, in the findings).

    Below the knee, every stream is paced by the step: one token per sequence per step, and
    at batch 1 that step reads every weight of the model to produce a single token. Next,
    lesson 07: can one forward pass give a sequence several tokens, and still write exactly
    what the model alone would have written?

    ## Where the code lives

    * `minivllm/engine/async_llm_engine.py`: `AsyncLLMEngine`, the step loop on its thread, the command
      queue (add, abort, stop), one output stream per request.
    * `minivllm/entrypoints/openai/serving.py`: the completions and chat endpoints, SSE streaming, the hold-back
      of text that may become a stop string; `minivllm/entrypoints/openai/api_server.py`: the app, errors, `/metrics`.
    * `minivllm/benchmarks/serve.py`: `minivllm bench serve`, the open-loop load generator used
      here. `uv run minivllm serve` serves the same thing from a terminal.
    """), v1_box])
    return (findings,)


if __name__ == "__main__":
    app.run()
