"""`minivllm bench serve`: an open-loop load generator against an OpenAI-compatible server,
vLLM's `vllm bench serve` in miniature (same report, same names).

vLLM twin: vllm/benchmarks/serve.py. Leaves out its datasets (ShareGPT, sonnet, ...: prompts
here are seeded word soup), goodput, burstiness and the chat endpoint (it loads /v1/completions).

    minivllm serve &                                      # or any OpenAI-compatible server
    minivllm bench serve --request-rate 4 --num-prompts 64
    minivllm bench serve --launch-server --compare-offline --request-rate inf 8 4 2

Open loop: request i is sent at its arrival time whatever the server is doing (Poisson
arrivals at --request-rate per second, or all at once with `inf`), as real users do; a closed
loop (send the next when one returns) would slow down with the server and hide its queueing.
Every request streams (TTFT and inter-token latency are seen by the client, as a user sees
them), is greedy with ignore_eos, so each produces exactly --output-len tokens.

--launch-server starts `minivllm serve` in a subprocess with --server-args (engine flags) on a
free port; --compare-offline first serves the same requests with LLM.generate on the same
engine flags in this process, so the report can say what the HTTP layer costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

# Prompts are seeded word soup of a given length: the content does not matter for speed, the
# lengths do, and the prompts differ (so the prefix cache only shares what real prompts would).
WORDS = ("the of and to in is was for on that with as by at from his her they be this are "
         "one all were when we there can an which their said if do will each about how up out "
         "them then she many some so these would other into has more two time like could "
         "people water first been call who now find long down day did get come made may part "
         "river music light story engine cache token model serve batch block memory").split()


@dataclass(slots=True)
class RequestResult:
    ok: bool = False
    error: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0                      # seconds, send to first token
    e2e: float = 0.0                       # seconds, send to last byte
    itls: list[float] = field(default_factory=list)   # between chunks


def make_prompts(num_prompts: int, input_len: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(input_len)) for _ in range(num_prompts)]


async def send_one(client, model: str, prompt: str, output_len: int) -> RequestResult:
    r = RequestResult()
    t0 = last = time.perf_counter()
    try:
        stream = await client.completions.create(
            model=model, prompt=prompt, max_tokens=output_len, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices and chunk.choices[0].text:
                if r.ttft == 0.0:
                    r.ttft = now - t0
                else:
                    r.itls.append(now - last)
                last = now
            if chunk.usage:
                r.prompt_tokens = chunk.usage.prompt_tokens
                r.output_tokens = chunk.usage.completion_tokens
        r.e2e = time.perf_counter() - t0
        r.ok = r.output_tokens > 0
    except Exception as e:                  # noqa: BLE001 -- counted and reported, not fatal
        r.error = f"{type(e).__name__}: {e}"
    return r


async def run_load(base_url: str, model: str, prompts: list[str], output_len: int,
                   request_rate: float, seed: int, api_key: str | None = None,
                   progress: bool = True, max_concurrency: int | None = None
                   ) -> tuple[list[RequestResult], float]:
    """Send every prompt at its Poisson arrival time, at most `max_concurrency` in flight
    (a request waits for a free one); return the results and the duration."""
    from openai import AsyncOpenAI
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key or "EMPTY",
                         max_retries=0, timeout=3600)
    rng = np.random.default_rng(seed)
    gaps = (np.zeros(len(prompts)) if request_rate == float("inf")
            else rng.exponential(1.0 / request_rate, len(prompts)))
    bar = tqdm(total=len(prompts), disable=not progress, desc="requests", dynamic_ncols=True)
    slots = asyncio.Semaphore(max_concurrency or len(prompts))

    async def one(delay: float, prompt: str) -> RequestResult:
        await asyncio.sleep(delay)
        async with slots:
            result = await send_one(client, model, prompt, output_len)
        bar.update(1)
        return result

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(d, p) for d, p in zip(np.cumsum(gaps), prompts)))
    duration = time.perf_counter() - t0
    bar.close()
    await client.close()
    return list(results), duration


def summarize(results: list[RequestResult], duration: float, request_rate: float) -> dict:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    ms = lambda xs, q: float(np.percentile(xs, q) * 1000) if len(xs) else float("nan")  # noqa
    mean = lambda xs: float(np.mean(xs) * 1000) if len(xs) else float("nan")  # noqa
    d = {"request_rate": request_rate, "completed": len(ok), "failed": len(results) - len(ok),
         "duration_s": duration, "total_input_tokens": in_tokens,
         "total_output_tokens": out_tokens, "request_throughput": len(ok) / duration,
         "output_throughput": out_tokens / duration,
         "total_token_throughput": (in_tokens + out_tokens) / duration,
         "errors": sorted({r.error for r in results if r.error})[:3]}
    series = {"ttft": [r.ttft for r in ok], "e2el": [r.e2e for r in ok],
              "itl": [x for r in ok for x in r.itls],
              "tpot": [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok
                       if r.output_tokens > 1]}
    for name, xs in series.items():
        d[f"mean_{name}_ms"] = mean(xs)
        d[f"median_{name}_ms"] = ms(xs, 50)
        d[f"p99_{name}_ms"] = ms(xs, 99)
    return d


def print_report(d: dict) -> None:
    line = lambda k, v: print(f"{k:<40}{v:<10.2f}" if isinstance(v, float)  # noqa: E731
                              else f"{k:<40}{v:<10}")
    print("{s:{c}^50}".format(s=" Serving Benchmark Result ", c="="))
    line("Request rate (req/s):", d["request_rate"])
    if d.get("max_concurrency"):
        line("Maximum request concurrency:", d["max_concurrency"])
    line("Successful requests:", d["completed"])
    line("Failed requests:", d["failed"])
    line("Benchmark duration (s):", d["duration_s"])
    line("Total input tokens:", d["total_input_tokens"])
    line("Total generated tokens:", d["total_output_tokens"])
    line("Request throughput (req/s):", d["request_throughput"])
    line("Output token throughput (tok/s):", d["output_throughput"])
    line("Total token throughput (tok/s):", d["total_token_throughput"])
    for name, title in [("ttft", "Time to First Token"),
                        ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")]:
        print("{s:{c}^50}".format(s=title, c="-"))
        for stat in ("mean", "median", "p99"):
            line(f"{stat.capitalize() if stat != 'p99' else 'P99'} {name.upper()} (ms):",
                 d[f"{stat}_{name}_ms"])
    for e in d["errors"]:
        print(f"error: {e}")
    print("=" * 50)


def offline_throughput(server_args: list[str], prompts: list[str], output_len: int) -> dict:
    """The same requests through LLM.generate on the same engine flags: the no-HTTP baseline.
    --server-args is read as MODEL and the engine's flags (engine/arg_utils.py), not with the
    server's parser (entrypoints/openai/cli_args.py): the CLI imports the benchmarks, so no
    benchmark imports an entry point. A server-only flag there is refused, by name."""
    from minivllm import LLM, SamplingParams
    from minivllm.engine.arg_utils import add_cli_args as add_engine_args
    from minivllm.engine.arg_utils import engine_kwargs
    parser = argparse.ArgumentParser(prog="minivllm bench serve --compare-offline --server-args")
    parser.add_argument("model", nargs="?", default=None)
    args = add_engine_args(parser).parse_args(server_args)
    llm = LLM(args.model, **engine_kwargs(args))
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    llm.generate(prompts[:4], params, use_tqdm=False)           # warm-up, as the server had
    t0, cpu0 = time.perf_counter(), time.process_time()
    outs = llm.generate(prompts, params, use_tqdm=False)
    duration, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    return {"duration_s": duration, "total_output_tokens": tokens,
            "output_throughput": tokens / duration, "cpu_ms_per_token": 1000 * cpu / tokens}


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process and its live children (the server's EngineCore
    process) have used so far (Linux /proc). On a shared machine it varies far less than
    wall time, so the HTTP layer's cost is compared in it too."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()     # fields 14 and 15: utime, stime
    children = [int(c) for task in os.listdir(f"/proc/{pid}/task")
                for c in open(f"/proc/{pid}/task/{task}/children").read().split()]
    return ((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            + sum(cpu_seconds(c) for c in children))


def launch_server(server_args: list[str], timeout: float = 300) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:                  # a free port (released just before the launch)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "minivllm.entrypoints.cli", "serve", "--port", str(port),
           "--uvicorn-log-level", "warning", *server_args]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}: {shlex.join(cmd)}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return proc, url
        except OSError:
            if time.perf_counter() - t0 > timeout:
                proc.terminate()
                raise SystemExit(f"the server did not answer /health in {timeout:.0f} s")
            time.sleep(0.5)


def served_model(base_url: str, api_key: str | None) -> str:
    req = urllib.request.Request(f"{base_url}/v1/models", headers={
        "Authorization": f"Bearer {api_key}"} if api_key else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)["data"][0]["id"]


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", default=None, help="default: http://HOST:PORT")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default=None, help="default: the first of /v1/models")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--request-rate", type=float, nargs="+", default=[float("inf")],
                        help="requests/s (Poisson arrivals); inf sends all at once; several values "
                             "run one after another")
    parser.add_argument("--max-concurrency", type=int, default=None,
                        help="requests in flight at most (a request waits for a free slot); "
                             "default: no limit")
    parser.add_argument("--input-len", type=int, default=64, help="words per prompt (~tokens)")
    parser.add_argument("--output-len", type=int, default=32, help="tokens per request")
    parser.add_argument("--launch-server", action="store_true",
                        help="start `minivllm serve` with --server-args, stop it at the end")
    parser.add_argument("--server-args", default="", help="MODEL and engine flags for "
                        "--launch-server and --compare-offline, e.g. '--max-num-seqs 64'")
    parser.add_argument("--compare-offline", action="store_true",
                        help="also time LLM.generate on the same requests and engine flags")
    parser.add_argument("--save-result", default=None, help="write the results as JSON here")
    parser.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> None:
    prompts = make_prompts(args.num_prompts, args.input_len, args.seed)
    server_args = shlex.split(args.server_args)
    offline = offline_throughput(server_args, prompts, args.output_len) \
        if args.compare_offline else None
    proc, base_url = (launch_server(server_args) if args.launch_server
                      else (None, args.base_url or f"http://{args.host}:{args.port}"))
    results = []
    try:
        model = args.model or served_model(base_url, args.api_key)
        asyncio.run(run_load(base_url, model, prompts[:4], args.output_len,   # warm-up
                             float("inf"), args.seed, args.api_key, progress=False))
        for rate in args.request_rate:
            cpu0 = cpu_seconds(proc.pid) if proc else None
            res, duration = asyncio.run(run_load(base_url, model, prompts, args.output_len,
                                                 rate, args.seed, args.api_key,
                                                 not args.no_progress, args.max_concurrency))
            results.append(summarize(res, duration, rate))
            results[-1]["max_concurrency"] = args.max_concurrency
            if proc:                       # the server process's CPU per generated token
                results[-1]["server_cpu_ms_per_token"] = 1000 * (
                    cpu_seconds(proc.pid) - cpu0) / max(1, results[-1]["total_output_tokens"])
                print(f"Server CPU per output token (ms):       "
                      f"{results[-1]['server_cpu_ms_per_token']:.2f}")
            print_report(results[-1])
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    if offline is not None:
        best = max(results, key=lambda d: d["output_throughput"])
        offline["http_overhead_pct"] = 100 * (1 - best["output_throughput"]
                                              / offline["output_throughput"])
        print(f"LLM.generate, same requests and engine flags: "
              f"{offline['output_throughput']:.1f} output tok/s in {offline['duration_s']:.1f} s; "
              f"the server at saturation: {best['output_throughput']:.1f} tok/s "
              f"(HTTP layer costs {offline['http_overhead_pct']:.1f}% of wall-clock throughput)")
        if "server_cpu_ms_per_token" in results[0]:
            offline["http_cpu_overhead_pct"] = 100 * (
                results[0]["server_cpu_ms_per_token"] / offline["cpu_ms_per_token"] - 1)
            print(f"CPU per output token: LLM.generate {offline['cpu_ms_per_token']:.2f} ms, "
                  f"the server at {results[0]['request_rate']} req/s "
                  f"{results[0]['server_cpu_ms_per_token']:.2f} ms (HTTP layer costs "
                  f"{offline['http_cpu_overhead_pct']:.1f}% CPU per token)")
    if args.save_result:
        with open(args.save_result, "w") as f:
            json.dump({"args": vars(args), "serve": results, "offline": offline}, f, indent=1,
                      default=str)
