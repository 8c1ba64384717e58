import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import time

    import marimo as mo
    import matplotlib.pyplot as plt
    import numpy as np
    import torch

    from minivllm import LLM, SamplingParams
    from minivllm.benchmarks.disagg import summarize, workload
    from minivllm.engine.disagg.disagg_llm import launch
    from minivllm.core.kv_cache import kv_bytes_per_token, reference_config
    from minivllm.workloads import serve
    return (LLM, SamplingParams, kv_bytes_per_token, launch, mo, np, plt,
            reference_config, serve, summarize, time, torch, workload)


@app.cell
def _(mo):
    mo.md(r"""
    # 08 · Prefill/decode disaggregation: two engines, one request

    After this lesson you can say why prefill and decode want different hardware, measure
    how much a long prompt's prefill slows the requests that are already decoding when both
    share one engine, run the two phases as two engines in two processes with the prompt's
    KV cache sent between them over `torch.distributed`, and compute from bytes alone when
    that transfer is cheap enough to be worth it on NVLink, InfiniBand, PCIe or Ethernet.

    Lesson 07 found a decode step so bound by memory that checking 5 tokens cost far less than
    5 steps: its arithmetic sits idle while the weights stream in. A prefill of hundreds of
    tokens is the opposite. Here the two kinds of work are measured side by side, then given an
    engine each.

    *Terms: TTFT, ITL, E2E latency, throughput and goodput are defined once for the course,
    in seconds and in engine steps, on the Glossary page (docs/glossary.md).*
    """)
    return


@app.cell
def _(LLM, launch, mo, torch):
    # Two engines over the same weights: `llm` serves colocated (prefill and decode in one
    # engine, as in every lesson so far); `pair` is a kv_producer here plus a kv_consumer in a
    # process of its own, started by one call (torch.multiprocessing). Fixed pools, so a GPU
    # does not size them from free memory.
    SETTINGS = dict(max_model_len=640, num_kv_blocks=160)
    llm = LLM(**SETTINGS)
    pair = launch(**SETTINGS)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    mo.md(f"**running on:** {device} · **model:** SmolLM2-135M-Instruct "
          f"({str(llm.engine.dtype).removeprefix('torch.')}) · **threads per process:** "
          f"{torch.get_num_threads()}  \n`{llm.engine!r}`  \n`{pair!r}`")
    return SETTINGS, device, llm, pair


@app.cell
def _(mo):
    mo.md(r"""
    ## Two phases, two kinds of work

    A step's cost has two parts: the arithmetic (FLOPs) and the bytes it must move from
    memory: every weight once per step, plus the KV cache it reads. Their ratio, FLOPs per
    byte, is the step's **arithmetic intensity**. A device has a peak FLOP rate and a peak
    bandwidth; a step whose intensity is below their ratio (the *ridge*) waits on memory,
    above it on arithmetic. This is the roofline model.

    A **prefill** of P tokens does about 2 x params x P FLOPs while reading the weights
    once: its intensity grows with P. A **decode** step of B sequences does 2 x params x B
    FLOPs for the same weight bytes, plus each sequence's KV: with B of 8, on a GPU, it stays
    far below the ridge. Below, both are measured on the real model, through the engine's own step
    trace, and put on the roofline of this device (its peaks measured too).
    """)
    return


@app.cell
def _(llm):
    import minivllm.benchmarks.roofline as _roofline

    # The course's one cost model (minivllm/benchmarks/roofline.py, introduced in lesson 01): this
    # device's peaks, measured, and a step's FLOPs and bytes from the model's shapes.
    _cost = _roofline.StepCost.of(llm.engine.model_config.hf_config, llm.engine.dtype)
    step_cost = _cost.step          # (new_tokens, context_lens, sampled) -> (FLOPs, bytes)
    _big = dict(n=8192, copy_mib=2048) if llm.engine.device.type == "cuda" else {}
    _peaks = _roofline.measure_peaks(llm.engine.device, llm.engine.dtype, **_big)
    PEAK_FLOPS, PEAK_BW, RIDGE = _peaks.flops, _peaks.bandwidth, _peaks.ridge
    print(f"this device: {PEAK_FLOPS / 1e9:.0f} GFLOP/s, {PEAK_BW / 1e9:.1f} GB/s, ridge "
          f"{RIDGE:.1f} FLOP/byte; linear params {_cost.linear_params / 1e6:.1f} M")
    return PEAK_BW, PEAK_FLOPS, RIDGE, step_cost


@app.cell
def _(SamplingParams, llm, np, step_cost):
    # Measured through the engine: a 512-token prefill (one step), then 8 sequences decoding.
    PREFILL_LEN, DECODE_BATCH = 512, 8
    _ids = llm.tokenizer.encode("Prefill is arithmetic, decode is memory traffic. " * 80)
    _greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm.generate([_ids[:64]], _greedy, use_tqdm=False)                       # warm-up
    llm.reconfigure(enable_prefix_caching=False)
    with llm.engine.trace() as _steps:
        llm.generate([_ids[:PREFILL_LEN]], SamplingParams(temperature=0, max_tokens=1),
                     use_tqdm=False)
    prefill_s = min(s.duration for s in _steps)
    with llm.engine.trace() as _steps:
        llm.generate([_ids[7 * i:7 * i + 32] for i in range(DECODE_BATCH)], _greedy,
                     use_tqdm=False)
    _decode_steps = [s for s in _steps if s.num_prefill_tokens == 0]
    decode_s = float(np.median([s.duration for s in _decode_steps]))
    llm.reconfigure(enable_prefix_caching=True)
    prefill_flops, prefill_bytes = step_cost([PREFILL_LEN], [PREFILL_LEN], 1)
    decode_flops, decode_bytes = step_cost([1] * DECODE_BATCH, [40] * DECODE_BATCH,
                                           DECODE_BATCH)
    intensity = {"prefill": prefill_flops / prefill_bytes, "decode": decode_flops / decode_bytes}
    achieved = {"prefill": prefill_flops / prefill_s, "decode": decode_flops / decode_s}
    for _k in intensity:
        print(f"{_k:8s}: {intensity[_k]:7.1f} FLOP/byte, achieved {achieved[_k] / 1e9:6.1f} "
              f"GFLOP/s ({1e3 * (prefill_s if _k == 'prefill' else decode_s):.0f} ms a step)")
    return (DECODE_BATCH, PREFILL_LEN, achieved, decode_s, intensity, prefill_s)


@app.cell
def _(
    DECODE_BATCH,
    PEAK_BW,
    PEAK_FLOPS,
    PREFILL_LEN,
    RIDGE,
    achieved,
    device,
    intensity,
    mo,
    np,
    plt,
):
    _fig, _ax = plt.subplots(figsize=(7, 4))
    _x = np.logspace(-1, 3, 200)
    _ax.loglog(_x, np.minimum(PEAK_FLOPS, PEAK_BW * _x) / 1e9, "k-", lw=1.5,
               label="roofline of this device")
    _ax.axvline(RIDGE, color="gray", ls=":", lw=1)
    for _k, _c in (("prefill", "tab:orange"), ("decode", "tab:blue")):
        _ax.loglog(intensity[_k], achieved[_k] / 1e9, "o", ms=10, color=_c,
                   label=f"{_k} ({PREFILL_LEN} tokens)" if _k == "prefill"
                   else f"{_k} (batch {DECODE_BATCH})")
    _ax.set_xlabel("arithmetic intensity, FLOP/byte")
    _ax.set_ylabel("GFLOP/s achieved")
    _ax.legend(fontsize=8)
    _ax.set_title("measured on this device, one engine step each", fontsize=10)
    _fig.tight_layout()
    _side = ("left of it: memory-bound, while prefill is right of it, compute-bound"
             if intensity["decode"] < RIDGE < intensity["prefill"] else
             "not where a GPU would put it: with one CPU thread the FLOP rate is so low that "
             "the ridge sits near a decode batch; what each step achieved still differs")
    mo.vstack([_fig, mo.md(f"""
    Prefill sits at **{intensity['prefill']:.0f} FLOP/byte**, decode at
    **{intensity['decode']:.1f}**. This device's ridge is at **{RIDGE:.1f}**: decode is
    {_side}. Prefill achieved **{achieved['prefill'] / achieved['decode']:.0f}x** the FLOP/s
    of decode, on the same weights. On an H100 the ridge is near 300 FLOP/byte (989 TFLOP/s
    bf16 over 3.35 TB/s) and a bf16 decode batch of 8 sits near 8: a GPU that only decodes
    wants memory bandwidth and room for KV, a GPU that only prefills wants FLOPs. (Measured
    here on {device}; the H100 numbers are its data sheet's.)
    """)])
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## The problem, measured: a long prefill stalls the decodes

    In one engine both phases share every step (lesson 10): when a 384-token prompt
    arrives, the step that prefills it carries the running decodes too, and they wait for
    the whole step. Four short requests decode 24 tokens each; two long prompts arrive,
    eight driver steps apart. The same requests are then served by the pair: the producer
    prefills, sends the prompt's KV, and the consumer, in its own process, decodes.
    """)
    return


@app.cell
def _(llm, pair, serve, summarize, workload):
    NUM_DECODES, LONG = 4, 384
    requests = workload(llm.tokenizer, NUM_DECODES, 24, 24, 2, LONG, 8)
    serve(pair, requests[:1])                                             # warm-up
    print("serving colocated, then split ...", flush=True)
    colocated_run = serve(llm, requests)
    colocated = summarize(colocated_run, NUM_DECODES)
    _before = pair.stats()
    split_run = serve(pair, requests)
    split = summarize(split_run, NUM_DECODES)
    split_consumer = pair.consumer_report()     # the decode side's own counters, now
    split_bytes = pair.stats()["bytes_sent"] - _before["bytes_sent"]
    split_cached = pair.stats()["cached_tokens_not_sent"] - _before["cached_tokens_not_sent"]
    split_transfers = pair.stats()["num_transfers"] - _before["num_transfers"]
    split_transfer_s = pair.stats()["transfer_seconds"] - _before["transfer_seconds"]
    prompt_tokens = sum(len(r.prompt) for r in requests)
    for _name, _r in (("colocated", colocated), ("disaggregated", split)):
        print(f"{_name:14s}: decode ITL mean {_r['itl_mean_ms']:6.0f} ms, max "
              f"{_r['itl_max_ms']:6.0f} ms; decode tokens behind a prefill "
              f"{_r['decode_tokens_behind_prefill']}; long TTFT {_r['ttft_long_ms']:.0f} ms")
    print(f"KV sent: {split_bytes} bytes for {prompt_tokens} prompt tokens, {split_cached} of "
          "them already in the consumer's prefix cache (not sent); outputs identical: "
          f"{colocated['tokens'] == split['tokens']}")
    return (LONG, NUM_DECODES, colocated, colocated_run, prompt_tokens, requests, split,
            split_bytes, split_cached, split_consumer, split_run, split_transfer_s,
            split_transfers)


@app.cell
def _(colocated, mo, plt, split):
    _fig, _ax = plt.subplots(figsize=(9, 3.4))
    for _name, _r, _c in (("colocated", colocated, "tab:red"),
                          ("disaggregated (consumer)", split, "tab:green")):
        _ax.plot(sorted(_r["itls_ms"]), color=_c, label=_name)
    _ax.set_yscale("log")
    _ax.set_xlabel("decode gaps, sorted")
    _ax.set_ylabel("ITL (inter-token latency), ms")
    _ax.legend(fontsize=8)
    _ax.set_title("every gap between the running decodes' tokens", fontsize=10)
    _fig.tight_layout()
    mo.vstack([_fig, mo.md(f"""
    Colocated, **{colocated['decode_tokens_behind_prefill']}** decode tokens were computed in
    a step that also carried prefill tokens; their worst gap was
    **{colocated['itl_max_ms']:.0f} ms**. Split, the consumer never ran a prefill (decode
    tokens behind a prefill: **{split['decode_tokens_behind_prefill']}**), and the worst gap
    was **{split['itl_max_ms']:.0f} ms**. On this CPU the two processes also share the
    machine's cores with each other (and with whatever else runs here), so some of the
    interference comes back as contention; on GPUs each role has its own devices. The
    counts do not depend on the machine; the milliseconds do.
    """)])
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Goodput per device: colocated, split, or chunked

    Two terms arrive here before the lessons that teach them. **Goodput** (glossary) counts
    only the requests that met their SLOs; **chunked prefill** (lesson 10) cuts a long prompt
    into pieces that fit each step's token budget, so a step never grows past it.

    DistServe (Zhong et al., OSDI 2024) and Splitwise (Patel et al., ISCA 2024) judge a
    deployment by **goodput per device**: DistServe's is a rate, the most requests per second
    a deployment serves with (say) 90% of them meeting both a TTFT SLO and an ITL SLO,
    divided by the GPUs it takes. Here the workload is a fixed set of requests, so we count
    how many of them met both SLOs, per device. Throughput alone hides the trade: colocated serving
    finishes the same tokens on one device, but a long prefill in a decode's step stretches
    that decode's ITL. Splitting gives each phase its own device, so each SLO is met by
    a device tuned for it; the question is whether the second device pays for itself.
    Lesson 10's chunked prefill is the third option: one device, prompts cut into chunks so
    that no step grows past the token budget, at the price of TTFT for long prompts.

    Counted, not timed, so that the answer holds on a loaded machine:

    - **Interference**: the largest step (tokens computed) a decoding request waited
      through. A decode's ITL is the duration of that step, and a step's duration grows
      with its tokens (lesson 10). For the split pair, the consumer reports it.
    - **SLO** (in steps and tokens, glossary terms): TTFT within 4 engine steps of arrival,
      and ITL: no decode step larger than 64 tokens.
    - **Goodput per device**: requests meeting both, over the devices (1, 2, 1).
    - **The transfer**: in minivllm's split pair the first token is sampled by the producer,
      so its TTFT does not include sending the KV; the transfer delays the *second* token
      instead. It is no engine step, so the step counts leave it out: its seconds are measured
      beside them. (vLLM V1 does it the other way round, and its TTFT does include the
      transfer: see the box at the end.)
    """)
    return


@app.cell
def _(
    NUM_DECODES,
    colocated_run,
    llm,
    colocated,
    requests,
    serve,
    split_consumer,
    split_run,
    split_transfer_s,
    split_transfers,
    summarize,
):
    SLO_TTFT_STEPS, SLO_STEP_TOKENS = 4, 64

    def largest_decode_steps(run):
        """Per request: the most tokens in a step where it decoded (0 if it never did)."""
        _ids = [o.request_id for o in run.outputs]
        return [max((st.num_batched_tokens for st in run.steps if any(
            sc.request_id == rid and not sc.is_prefill for sc in st.scheduled)), default=0)
                for rid in _ids]

    print("serving with chunked prefill (64-token budget) ...", flush=True)
    _budget = llm.engine.vllm_config.scheduler_config.max_num_batched_tokens
    llm.reconfigure(max_num_batched_tokens=SLO_STEP_TOKENS)
    chunked_run = serve(llm, requests)
    llm.reconfigure(max_num_batched_tokens=_budget)
    chunked = summarize(chunked_run, NUM_DECODES)

    def attainment(run, largest):
        """Requests meeting both SLOs: TTFT in steps, and every decode step within budget."""
        return sum(t <= SLO_TTFT_STEPS and big <= SLO_STEP_TOKENS
                   for t, big in zip(run.ttft_steps, largest))

    interference = {
        "colocated": max(largest_decode_steps(colocated_run)),
        "split": split_consumer["largest_decode_step_tokens"],
        "chunked": max(largest_decode_steps(chunked_run)),
    }
    # Split: TTFT is the producer's (it prefills whole prompts, each right away here), and
    # no consumer step was larger than the interference count, which bounds every request.
    goodput = {
        "colocated": attainment(colocated_run, largest_decode_steps(colocated_run)),
        "split": sum(t <= SLO_TTFT_STEPS for t in split_run.ttft_steps)
        if interference["split"] <= SLO_STEP_TOKENS else 0,
        "chunked": attainment(chunked_run, largest_decode_steps(chunked_run)),
    }
    devices = {"colocated": 1, "split": 2, "chunked": 1}
    goodput_per_device = {k: goodput[k] / devices[k] for k in goodput}
    for _k in goodput:
        print(f"{_k:9s}: largest step a decode waited through {interference[_k]:4d} tokens; "
              f"{goodput[_k]}/{len(requests)} requests met the SLO on {devices[_k]} device(s): "
              f"goodput {goodput_per_device[_k]:.1f} per device")
    print(f"chunked: outputs identical to colocated: {chunked['tokens'] == colocated['tokens']}")
    print(f"split: {split_transfers} KV transfers, {1e3 * split_transfer_s:.1f} ms sending in all "
          "(between each request's first and second token; not in its TTFT)")
    return (SLO_STEP_TOKENS, SLO_TTFT_STEPS, chunked, goodput, goodput_per_device,
            interference)


@app.cell
def _(SLO_STEP_TOKENS, SLO_TTFT_STEPS, goodput, goodput_per_device, interference, mo):
    mo.md(f"""
    The largest step a decode waited through: **{interference['colocated']}** tokens
    colocated (a whole long prompt rode along), **{interference['split']}** on the split
    pair's consumer (decodes only), **{interference['chunked']}** with chunked prefill (the
    budget). Under the SLO (TTFT within {SLO_TTFT_STEPS} steps, no decode step over
    {SLO_STEP_TOKENS} tokens), requests served well: colocated {goodput['colocated']},
    split {goodput['split']}, chunked {goodput['chunked']}; per device
    **{goodput_per_device['colocated']:.1f} / {goodput_per_device['split']:.1f} /
    {goodput_per_device['chunked']:.1f}**. Chunked prefill meets the ITL SLO on one device
    and pays in TTFT (a 384-token prompt needs 6 chunks); the split pair meets both, on two
    devices. Which wins per device depends on how tight the TTFT SLO is against the prompt
    lengths: DistServe's finding at scale is that with tight SLOs on both, disaggregation
    gives more goodput per GPU, because neither phase's device is sized for the other.
    """)
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## The mechanism: what crosses the wire

    The KV connector has two sides, as in vLLM V1: a scheduler side in the engine core
    (which blocks of which request move) and a worker side beside the model runner (the
    transfer into and out of the KV pool), told what to do by the metadata each step's
    `SchedulerOutput` carries. On the producer, the step that samples a request's first token
    ends with `KVConnectorWorker.wait_for_save`: it gathers the prompt's blocks from the pool,
    keeps only the P slots the prompt fills (the last block is partly empty: those slots are
    not sent), and announces the request with its first token. The consumer's receiving
    thread answers how many leading tokens its own prefix cache already holds (whole blocks),
    and only the rest crosses, as one `(layers, 2, tokens, kv_heads, head_dim)` tensor. It
    lands while the consumer keeps decoding; then `add_prefilled_request` (disagg_llm.py) takes
    blocks in the consumer's own pool (reusing cached prefix blocks) and puts the request
    among the running ones, its first token already there, and the next step's
    `start_load_kv` writes the K/V into those blocks before the forward reads them. Nothing
    else about the request changes: the consumer's scheduler sees an ordinary decoding
    sequence.
    """)
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Is the transfer worth it? Bytes over a link

    A prompt of P tokens sends P x (KV bytes per token). Whether the split pays depends on
    how that transfer compares with the prefill it follows: both grow with P, so the ratio is
    set by the model (KV bytes per token against FLOPs per token) and by the link against the
    GPU. Below, link speeds from data sheets (one direction), the KV bytes per token from
    each model's shape, and prefill time on H100s estimated as FLOPs / (989 TFLOP/s x 50%
    utilization) per GPU. The 135M and the 8B fit one H100. The 70B does not: its 140 GB of
    bf16 weights need at least two 80 GB H100s, so it runs tensor parallel over four (TP=4,
    lesson 15), each GPU computing a quarter of the prefill and sending its quarter of the KV
    heads over a link of its own. These are computed, not measured; the measured part is the
    loopback transfer of this run.
    """)
    return


@app.cell
def _(kv_bytes_per_token, llm, prompt_tokens, reference_config, split_bytes, split_cached,
      torch):
    LINKS = {"NVLink 4 (H100)": 450e9, "PCIe 5 x16": 63e9, "InfiniBand NDR 400G": 50e9,
             "100 GbE": 12.5e9}
    _shape = llm.engine.model_config.hf_config
    # model -> (KV bytes per token, parameters, H100s it runs on)
    MODELS = {"SmolLM2-135M (fp32, this run)": (kv_bytes_per_token(_shape, llm.engine.dtype),
                                                0.135e9, 1),
              "Llama-3-8B (bf16)": (kv_bytes_per_token(reference_config("Llama-3-8B"),
                                                       torch.bfloat16), 8e9, 1),
              "Llama-3-70B (bf16, TP=4)": (kv_bytes_per_token(reference_config("Llama-3-70B"),
                                                              torch.bfloat16), 70e9, 4)}
    H100_FLOPS = 0.5 * 989e12
    H100_BYTES = 80e9
    for _name, (_, _params, _gpus) in MODELS.items():     # bf16 weights fit their GPUs
        assert 2 * _params < _gpus * H100_BYTES, _name
    measured_bytes_per_token = split_bytes / (prompt_tokens - split_cached)

    def transfer_vs_prefill(model, link, num_tokens):
        """(transfer seconds, estimated prefill seconds) for a prompt of num_tokens, on the
        model's H100s: each computes 1/gpus of the prefill and sends 1/gpus of the KV."""
        per_token, params, gpus = MODELS[model]
        return (num_tokens * per_token / (gpus * LINKS[link]),
                2 * params * num_tokens / (gpus * H100_FLOPS))
    return LINKS, MODELS, measured_bytes_per_token, transfer_vs_prefill


@app.cell
def _(LINKS, MODELS, mo, transfer_vs_prefill):
    prompt_len = mo.ui.slider(start=256, stop=32768, step=256, value=4096, show_value=True,
                              label="prompt tokens")
    link = mo.ui.dropdown(options=list(LINKS), value="100 GbE", label="link")
    model = mo.ui.dropdown(options=list(MODELS), value="Llama-3-8B (bf16)", label="model")
    # The links that keep the transfer under the prefill are the fastest few, so an answer
    # is how many of them: label -> count.
    _fast = sorted(LINKS, key=LINKS.get, reverse=True)
    _answers = {"none of them": 0, f"{_fast[0]} only": 1,
                **{", ".join(_fast[:_k]): _k for _k in range(2, len(_fast))},
                f"all {len(_fast)}": len(_fast)}
    # Headless, the answer from the model's shape is filled in, so that the checker's
    # verdict (from the bytes the connector counted) is tested below.
    _headless = mo.app_meta().mode == "script" or "headless" in mo.cli_args()
    _small = next(iter(MODELS))                     # the 135M, this run's model
    _shape_says = sum(_send < _prefill for _send, _prefill in
                      (transfer_vs_prefill(_small, _l, 4096) for _l in LINKS))
    _shape_answer = next(_a for _a, _k in _answers.items() if _k == _shape_says)
    links_guess = mo.ui.dropdown(_answers, value=_shape_answer if _headless else None,
                                 label="for the 135M, the transfer beats the prefill on")
    mo.md(f"""
    ### Try it: find where splitting stops paying

    Pick a link, a model and a prompt length. The split pays while sending the KV takes
    clearly less than computing it did; when the transfer takes longer than the prefill, the
    request's first token is later than colocated and the decode GPU sits waiting for bytes.
    Guess first: for the 135M model, which links keep the transfer under the prefill? Pick
    your answer; the box under the chart checks it against the bytes the connector counted.
    The slider also sends a real prompt of that many tokens (at most 256, to stay quick)
    through the pair, and counts the bytes.

    {links_guess}

    {prompt_len} {link} {model}
    """)
    return link, links_guess, model, prompt_len


@app.cell
def _(LINKS, SamplingParams, link, mo, model, np, pair, plt, prompt_len, llm,
      transfer_vs_prefill):
    _n = min(prompt_len.value, 256)
    _before = pair.stats()
    pair.generate([llm.tokenizer.encode("x " * 2 * _n)[:_n]],
                  SamplingParams(temperature=0, max_tokens=2))
    _sent = pair.stats()["bytes_sent"] - _before["bytes_sent"]
    _held = pair.stats()["cached_tokens_not_sent"] - _before["cached_tokens_not_sent"]
    _t, _p = transfer_vs_prefill(model.value, link.value, prompt_len.value)
    _fig, _ax = plt.subplots(figsize=(8, 3.4))
    _lens = np.array([256, 1024, 4096, 16384, 32768])
    for _name in LINKS:
        _ax.loglog(_lens, [1e3 * transfer_vs_prefill(model.value, _name, n)[0] for n in _lens],
                   "-", lw=2.5 if _name == link.value else 1, label=f"transfer, {_name}")
    _ax.loglog(_lens, [1e3 * transfer_vs_prefill(model.value, link.value, n)[1] for n in _lens],
               "k--", label="prefill on H100s (estimate)")
    _ax.axvline(prompt_len.value, color="gray", ls=":")
    _ax.set_xlabel("prompt tokens")
    _ax.set_ylabel("ms")
    _ax.legend(fontsize=7)
    _ax.set_title(model.value, fontsize=10)
    _fig.tight_layout()
    _verdict = ("**the transfer is slower than the prefill: splitting loses here**"
                if _t > _p else f"the transfer is {_p / _t:.1f}x faster than the prefill")
    mo.vstack([_fig, mo.md(
        f"{prompt_len.value} tokens of {model.value} over {link.value}: transfer "
        f"**{1e3 * _t:.1f} ms**, prefill **{1e3 * _p:.1f} ms**: {_verdict}.  \n"
        f"Live: the pair just sent **{_sent:,} bytes** for a {_n}-token prompt, "
        f"{_held} of its tokens were in the consumer's prefix cache already (an earlier "
        f"prompt of x's) and stayed home ({_sent // (_n - _held):,} bytes per token sent).")])
    return


@app.cell
def _(LINKS, MODELS, measured_bytes_per_token, transfer_vs_prefill):
    def check_links_guess(count, num_tokens=4096):
        """How many links (fastest first) send the 135M's prompt KV faster than an H100
        prefills it: the learner's count against the bytes the connector counted in the
        split run above. Both grow with the prompt, so its length does not matter."""
        if count is None:
            return "Pick an answer."
        fast = sorted(LINKS, key=LINKS.get, reverse=True)
        # The H100's prefill is the data sheet's estimate (the same over every link); the
        # bytes to send are the ones the connector counted.
        prefill = transfer_vs_prefill(next(iter(MODELS)), fast[0], num_tokens)[1]
        send = {name: num_tokens * measured_bytes_per_token / LINKS[name] for name in fast}
        truth = sum(send[name] < prefill for name in fast)
        counts = (f"The connector counted {measured_bytes_per_token:,.0f} bytes per prompt "
                  f"token; for {num_tokens:,} tokens that is "
                  + ", ".join(f"{1e3 * send[name]:.1f} ms over {name}" for name in fast)
                  + f", against {1e3 * prefill:.1f} ms of prefill (the estimate above).")
        if count == truth:
            return f"Correct: {truth} of the {len(fast)} links. {counts}"
        if count > truth:
            return f"Too many: {fast[truth]} is already slower than the prefill. {counts}"
        return f"Too few: {fast[count]} is faster than the prefill too. {counts}"
    return (check_links_guess,)


@app.cell
def _(check_links_guess, links_guess, mo):
    _msg = check_links_guess(links_guess.value)
    mo.callout(mo.md(f"Your prediction: **{links_guess.selected_key}**. {_msg}"),
               kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(mo):
    mo.md(r"""
    ## Exercise: how many bytes does the connector send?

    Fill in `kv_bytes_to_send(num_prompt_tokens)` for this run's model (30 layers, 3 KV
    heads of 64, fp32, blocks of 16 tokens). The checker sends prompts of several lengths
    through the live pair and compares your numbers with the bytes it counted. Each prompt
    starts with a token of its own, so the consumer has none of it cached.
    """)
    return


@app.function
def kv_bytes_to_send(num_prompt_tokens: int) -> int | None:
    # Your answer here: bytes of K and V for the prompt, as the connector sends them.
    return None


@app.cell
def _(SamplingParams, llm, pair):
    EX_LENGTHS = (1, 16, 17, 100)

    def measure_sent(n):
        before = pair.stats()["bytes_sent"]
        pair.generate([[1000 + n] + llm.tokenizer.encode("y " * 2 * n)[:n - 1]],
                      SamplingParams(temperature=0, max_tokens=2))
        return pair.stats()["bytes_sent"] - before

    exercise_truth = {n: measure_sent(n) for n in EX_LENGTHS}

    def check_kv_bytes(fn):
        got = {n: fn(n) for n in EX_LENGTHS}
        if any(v is None for v in got.values()):
            return "Fill in kv_bytes_to_send: it returns None."
        if got == exercise_truth:
            return f"Correct: {exercise_truth}, counted by the connector."
        per = exercise_truth[1]
        if got[17] == 32 * per:
            return ("Close: you padded to whole 16-token blocks. The connector sends only "
                    "the slots the prompt fills, not the empty rest of its last block.")
        if got[1] * 2 == per:
            return "Half: a token has a K and a V in every layer."
        if got[1] * 4 == per:
            return "A quarter off: fp32 is 4 bytes per element."
        return (f"Not yet: for 1 token the connector sent {per} bytes, and the count grows "
                "by the same amount per token.")
    return EX_LENGTHS, check_kv_bytes, exercise_truth


@app.cell
def _(check_kv_bytes, mo):
    _msg = check_kv_bytes(kv_bytes_to_send)
    mo.callout(mo.md(_msg), kind="success" if _msg.startswith("Correct") else "neutral")
    return


@app.cell
def _(
    EX_LENGTHS,
    LINKS,
    LONG,
    NUM_DECODES,
    SLO_STEP_TOKENS,
    check_kv_bytes,
    check_links_guess,
    chunked,
    colocated,
    exercise_truth,
    goodput,
    intensity,
    interference,
    kv_bytes_per_token,
    links_guess,
    llm,
    pair,
    prompt_tokens,
    requests,
    split,
    split_bytes,
    split_cached,
    split_consumer,
    split_transfer_s,
    split_transfers,
):
    def test_prefill_is_far_more_intense_than_decode():
        # FLOPs and bytes counted from the shapes of the two steps; the achieved FLOP/s are
        # shown beside, not asserted (a loaded machine moves them).
        assert intensity["prefill"] > 10 * intensity["decode"]

    def test_largest_step_a_decode_waited_through():
        # Counted on each engine: colocated, a decode rode along with a whole long prompt;
        # the split pair's consumer ran decodes only (at most one token per request there,
        # and no prefill step); chunked prefill kept every step within its token budget.
        assert colocated["decode_tokens_behind_prefill"] > 0
        assert interference["colocated"] >= LONG
        assert split_consumer["num_prefill_steps"] == 0
        assert 1 <= interference["split"] <= len(requests)
        assert interference["chunked"] <= SLO_STEP_TOKENS < interference["colocated"]

    def test_goodput_under_the_slo():
        # The decodes that shared a step with a long prefill miss the ITL SLO colocated; the
        # split pair serves every request within both SLOs, on two devices.
        assert goodput["colocated"] <= len(requests) - NUM_DECODES // 2
        assert goodput["split"] == len(requests)
        assert goodput["chunked"] > goodput["colocated"]
        assert chunked["tokens"] == colocated["tokens"]

    def test_split_outputs_equal_colocated():
        assert colocated["tokens"] == split["tokens"]

    def test_every_split_request_crossed_once():
        # Counted by the producer's connector: one transfer per request, and it took time
        # the split's TTFT (the producer's first token) does not include.
        assert split_transfers == len(requests)
        assert split_transfer_s > 0

    def test_connector_sends_exactly_the_prompt_kv():
        per_token = kv_bytes_per_token(llm.engine.model_config.hf_config, llm.engine.dtype)
        assert split_bytes == (prompt_tokens - split_cached) * per_token > 0
        # The warm-up left request 0's full prompt block in the consumer's prefix cache: the
        # producer did not send it again.
        assert split_cached > 0
        assert exercise_truth == {n: n * per_token for n in EX_LENGTHS}
        assert pair.stats()["num_reprefilled"] == 0 and pair.stats()["connected"]

    def test_exercise_checker():
        per_token = exercise_truth[1]
        assert check_kv_bytes(lambda n: n * per_token).startswith("Correct")
        assert "padded" in check_kv_bytes(lambda n: -(-n // 16) * 16 * per_token)
        assert "None" in check_kv_bytes(lambda n: None)

    def test_the_engine_checks_the_links_guess():
        # The headless run answered from the model's shape (kv_bytes_per_token); the bytes
        # the connector counted decide, and every other count of links is turned down.
        assert check_links_guess(links_guess.value).startswith("Correct")
        for _wrong in range(len(LINKS) + 1):
            if _wrong != links_guess.value:
                assert not check_links_guess(_wrong).startswith("Correct")
    return


@app.cell
def _(
    colocated,
    goodput_per_device,
    intensity,
    interference,
    measured_bytes_per_token,
    mo,
    pair,
    split,
    split_transfer_s,
    split_transfers,
    transfer_vs_prefill,
):
    consumer = pair.consumer_report()           # the consumer's counters, right now
    findings = {
        "prefill_intensity": intensity["prefill"], "decode_intensity": intensity["decode"],
        "colocated_decode_tokens_behind_prefill": colocated["decode_tokens_behind_prefill"],
        "split_decode_tokens_behind_prefill": split["decode_tokens_behind_prefill"],
        "consumer_prefill_steps": consumer["num_prefill_steps"],
        "consumer_leaked_blocks": consumer["num_referenced_blocks"],
        "largest_step_a_decode_waited_through": interference,
        "goodput_per_device": goodput_per_device,
        "worst_decode_gap_ms": {"colocated": colocated["itl_max_ms"],
                                "disaggregated": split["itl_max_ms"]},
        "kv_bytes_per_prompt_token": measured_bytes_per_token,
        "split_kv_transfers": split_transfers,
        "split_transfer_ms": round(1e3 * split_transfer_s, 1),
        "llama70b_tp4_4k_100gbe_transfer_ms": 1e3 * transfer_vs_prefill(
            "Llama-3-70B (bf16, TP=4)", "100 GbE", 4096)[0],
    }
    print("findings:", findings)
    mo.md(f"""
    ## What we found

    * Prefill ran at **{intensity['prefill']:.0f} FLOP/byte** and decode at
      **{intensity['decode']:.1f}**: the two phases sit on opposite sides of the ridge.
    * Colocated, **{colocated['decode_tokens_behind_prefill']}** decode tokens waited on a
      prefill in their step; split, **{split['decode_tokens_behind_prefill']}**, and the
      consumer ran **{consumer['num_prefill_steps']}** prefill steps and ended with
      **{consumer['num_referenced_blocks']}** blocks still held.
    * Interference, counted as the largest step a decode waited through:
      **{interference['colocated']}** tokens colocated, **{interference['split']}** split,
      **{interference['chunked']}** with chunked prefill. Goodput per device under a TTFT and
      an ITL SLO (in steps and tokens): colocated {goodput_per_device['colocated']:.1f},
      split {goodput_per_device['split']:.1f}, chunked {goodput_per_device['chunked']:.1f}
      (DistServe and Splitwise's measure; the milliseconds are shown above, beside).
    * The connector sent **{measured_bytes_per_token:,.0f} bytes per prompt token**, exactly
      the KV of the prompt tokens the consumer did not already cache, in **{split_transfers}**
      transfers that took **{1e3 * split_transfer_s:.0f} ms** here (loopback, on this
      machine): in minivllm's pair, time that falls between each request's first and second
      token, not in its TTFT (in vLLM V1 it falls inside the TTFT: see the box below). For
      a 70B model in bf16 a 4,096-token prompt's KV is 1.3 GB; on four H100s
      (TP=4), each sending its quarter over its own 100 GbE link, about
      **{findings['llama70b_tp4_4k_100gbe_transfer_ms']:.0f} ms**, a few ms over NVLink
      (computed from data sheets).

    What crossed between the engines was the KV of every prompt token: 2 x layers x KV heads x
    head dim x bytes (lesson 01), and the model, not the engine, sets the KV heads. Next,
    lesson 09: what do 3 KV heads for 9 query heads (GQA) save in cache bytes, pool capacity
    and decode reads, and why can it not be switched on after training?

    ## Where the code lives

    * `minivllm/distributed/kv_transfer/kv_connector.py`: `KVConnectorScheduler`
      (`update_state_after_alloc`, `build_connector_meta`) and `KVConnectorWorker`
      (`start_load_kv`, `wait_for_save`), vLLM V1's two sides of a connector.
    * `minivllm/distributed/kv_transfer/kv_pipe.py`: `TorchDistributedPipe` (rendezvous and
      the checks that refuse a bad pairing, the receiving thread).
    * `minivllm/engine/disagg/disagg_llm.py`: `DisaggLLM.step` (hand-off after the first token, outputs
      streamed back, re-prefill when the consumer refuses a request or dies), `launch` and
      `serve_decode` (the consumer's loop).
    * `add_prefilled_request` there and `EngineCore.add_prefilled_request`
      (`minivllm/engine/core.py`): the consumer's way in.
    * `minivllm/config/kv_transfer.py`: `KVTransferConfig`, vLLM's `kv_transfer_config`.
    * `minivllm/benchmarks/disagg.py`: `minivllm bench disagg`, the same comparison with more load.
    """)
    return (findings,)


@app.cell
def _(mo):
    mo.callout(mo.md(r"""
    **In vLLM V1** (as of vLLM 0.33). Open
    `vllm/distributed/kv_transfer/kv_connector/v1/base.py`: `KVConnectorBase_V1`, with a
    scheduler side (`get_num_new_matched_tokens`,
    `update_state_after_alloc`, `build_connector_meta`, `request_finished`) and a worker
    side (`start_load_kv`, `wait_for_layer_load`, `save_kv_layer`, `wait_for_save`,
    `get_finished`); ours keeps four of those names (`update_state_after_alloc`,
    `build_connector_meta`, `start_load_kv`, `wait_for_save`). The NIXL connector, the one
    used in production, is no longer one `nixl_connector.py` file but a package beside
    `base.py`, `kv_connector/v1/nixl/`: `NixlConnector` (in `connector.py`) is now another name
    for `NixlPullConnector`, where the decode side reads the prefill GPU's blocks over RDMA,
    and `NixlPushConnector` has the prefill side write them instead; each has its scheduler
    and worker halves in files of their own (`pull_scheduler.py`, `pull_worker.py`, ...).
    `vllm/v1/core/sched/scheduler.py` is where the scheduler calls them.

    The first token is where V1 differs most from this page. A request carries
    `kv_transfer_params`: on the prefill instance `do_remote_decode` is set, and the token that
    instance samples is not handed on; when it finishes, `request_finished` keeps its blocks
    alive and returns where they are. The decode instance gets the same prompt with
    `do_remote_prefill` set: `get_num_new_matched_tokens` answers that the prompt's KV will
    arrive asynchronously, so the scheduler parks the request as `WAITING_FOR_REMOTE_KVS`
    until the worker reports the blocks received. Then, with the whole prompt counted as
    computed, it steps `num_computed_tokens` back by one, recomputes the last prompt token and
    samples the first output token on the decode instance. So in V1 the transfer sits inside
    the TTFT (prefill, transfer, then one decode-side step), and the first token is the
    decode instance's own; in minivllm the producer samples the first token and the transfer
    lands between the first and second token, as measured above.
    minivllm also differs in how the bytes move: the producer pushes the whole prompt's KV as
    one tensor over `torch.distributed` after the last layer, where vLLM's interface allows
    saving layer by layer and NIXL moves the blocks GPU to GPU over RDMA. One tensor over a
    plain socket is something a reader can count byte for byte on a CPU; the layer-by-layer
    overlap only pays on a GPU.
    """), kind="info")
    return


if __name__ == "__main__":
    app.run()
