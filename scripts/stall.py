"""A long prompt beside a stream, against a real `minivllm serve` (issue 43's stall check).

    python scripts/stall.py [SERVE FLAGS]       e.g. --max-num-batched-tokens 512

Starts `minivllm serve --max-model-len 6144 FLAGS` on a free port, streams one completion of
150 tokens, sends a ~4,800-token prompt beside it after the stream's third chunk, and prints
the stream's largest and median gap between chunks and the long request's seconds (its TTFT).
The numbers in docs/benchmarks.md ("A long prompt beside a stream") come from it.
"""

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request


def main(flags: list[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "minivllm.entrypoints.cli", "serve",
                               "--port", str(port), "--max-model-len", "6144", *flags])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):                        # up to 5 minutes for the start-up
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        model = json.load(urllib.request.urlopen(url + "/v1/models"))["data"][0]["id"]
        print(json.dumps({"flags": flags, **stall(url, model)}), flush=True)
    finally:
        server.terminate()
        server.wait(30)


def post(url: str, body: dict):
    return urllib.request.urlopen(urllib.request.Request(
        url + "/v1/completions", json.dumps(body).encode(),
        {"Content-Type": "application/json"}), timeout=600)


def stall(url: str, model: str) -> dict:
    long_prompt = " ".join(f"word{i % 97}" for i in range(1650))     # ~4,800 tokens
    done = {}

    def long_request():
        t0 = time.perf_counter()
        with post(url, {"model": model, "prompt": long_prompt, "max_tokens": 1}) as r:
            done["prompt_tokens"] = json.load(r)["usage"]["prompt_tokens"]
        done["long_s"] = round(time.perf_counter() - t0, 2)

    times, sender = [], threading.Thread(target=long_request)
    with post(url, {"model": model, "prompt": "Once upon a time", "max_tokens": 150,
                    "ignore_eos": True, "stream": True}) as r:
        for line in r:
            if line.startswith(b"data: {"):
                times.append(time.perf_counter())
                if len(times) == 3:
                    sender.start()
    sender.join()
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    return {"max_gap_s": round(gaps[-1], 2), "median_gap_s": round(gaps[len(gaps) // 2], 3),
            **done}


if __name__ == "__main__":
    main(sys.argv[1:])
