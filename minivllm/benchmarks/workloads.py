"""Workloads and the one driver that serves them: what lessons, benchmarks and tests share.

vLLM twin: vllm/benchmarks/datasets.py (its request generators); `serve` has no twin, vLLM's
benchmarks time whole runs, not each step. Leaves out datasets read from files (ShareGPT).

    requests = lognormal_requests(llm.tokenizer, 16, prompt=(3.8, 0.7, 8, 400),
                                  output=(3.9, 0.6, 4, 160), seed=0)
    run = serve(llm, requests)          # every step recorded
    run.steps[3].num_decode_tokens, run.outputs[0].metrics.ttft, run.output_throughput

A Request is a prompt, its SamplingParams, and when it arrives: at an engine step
(`arrival_step`, deterministic, for lessons and tests) or at a time (`arrival_time` seconds
after the start, open loop, for latency measurements). `follows=i` makes a multi-turn chat:
the request's prompt is appended to request i's prompt and answer, and it arrives only once
request i has finished (and then `arrival_time` seconds later: the user's think time).

The generators are seeded and draw lengths the way real traffic looks: log-normal, most
requests short and a long tail. Benchmark requests ignore EOS, so each produces exactly its
max_tokens and a schedule is the same on every machine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams
from minivllm.engine.stats import StepRecord

FILLER = ("Serving a language model is mostly a memory problem. Each request keeps the keys "
          "and values of its context, and the engine decides where they live, which requests "
          "share a step, and what to do when memory runs out. ")


# The copy task's text and instructions (speculation's best case: the answer is in the prompt),
# shared by `bench spec` and mixed_requests.
COPY_TEXT = (
    "Serving a language model is mostly a memory problem. Each request keeps the keys and "
    "values of its context, and the engine decides where they live, which requests share a "
    "step, and what to do when memory runs out. Paged attention cuts that memory into "
    "blocks, so no request reserves more than it uses. Continuous batching lets a new request "
    "join the batch as soon as another one finishes. Prefix caching reuses the blocks of a "
    "shared system prompt. Speculative decoding guesses several tokens and checks them in "
    "one forward pass, which is cheap when decoding is limited by memory bandwidth.")
COPY_EDITS = ["Repeat the following text exactly", "Copy this text, word for word",
              "Rewrite this text, changing nothing", "Proofread this text and return it unchanged"]


def chat_prompt(tokenizer, message: str) -> list[int]:
    """One user message in the model's chat template, as token ids."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": message}],
                                         add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


@dataclass(slots=True)
class Request:
    prompt: list[int] | str
    params: SamplingParams
    arrival_step: int = 0           # added before this engine step (0: at the start)
    arrival_time: float = 0.0       # ... and not before this many seconds after the start
    follows: int | None = None      # multi-turn: continue the chat of request `follows`,
    #                                 arrival_time seconds (the user's think time) after it ends


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=int(max_tokens), ignore_eos=True)


def _token_source(tokenizer, num_tokens: int, text: str) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids * (num_tokens // len(ids) + 1)


def lognormal_requests(tokenizer, num_requests: int, prompt=(4.3, 0.6, 16, 512),
                       output=(4.3, 0.7, 8, 512), seed: int = 0, text: str = FILLER,
                       stride: int = 7) -> list[Request]:
    """Requests whose prompt and output lengths are log-normal: prompt and output are
    (mu, sigma, min, max) of the length's log-normal, clipped. Prompts are windows of `text`
    (start `stride` tokens apart, so no two are alike); greedy, EOS ignored."""
    rng = np.random.default_rng(seed)
    prompt_lens = np.clip(rng.lognormal(*prompt[:2], num_requests), *prompt[2:]).astype(int)
    output_lens = np.clip(rng.lognormal(*output[:2], num_requests), *output[2:]).astype(int)
    ids = _token_source(tokenizer, num_requests * stride + int(prompt_lens.max()), text)
    return [Request(ids[i * stride:i * stride + int(p)], _greedy(o))
            for i, (p, o) in enumerate(zip(prompt_lens, output_lens))]


def spread_requests(tokenizer, num_requests: int, mean_output: int, spread: float,
                    prompt_range=(8, 32), seed: int = 0, text: str = FILLER) -> list[Request]:
    """Short prompts; output lengths log-normal around mean_output with sigma `spread`,
    rescaled so every spread asks for about the same tokens in total: only the mix changes
    (lesson 04's knob: how unequal the requests sharing a batch are)."""
    rng = np.random.default_rng(seed)
    weights = np.exp(spread * rng.standard_normal(num_requests))
    prompt_lens = rng.integers(prompt_range[0], prompt_range[1] + 1, num_requests)
    outs = np.maximum(1, np.rint(mean_output * weights / weights.mean())).astype(int)
    ids = _token_source(tokenizer, 7 * num_requests + prompt_range[1], text)
    return [Request(ids[7 * i:7 * i + int(p)], _greedy(o))
            for i, (p, o) in enumerate(zip(prompt_lens, outs))]


def tool_catalog_prompt(tokenizer, name: str, num_tokens: int) -> list[int]:
    """A system prompt of num_tokens tokens: an agent's instructions and its tools, the kind
    of long shared prefix every request of an application starts with."""
    text = (f"You are {name}, an agent that answers by calling tools. Call one tool per "
            "message, as one line of JSON. Never invent results.\nTools:\n")
    i = 0
    while len(tokenizer.encode(text)) < num_tokens:
        text += (f"- tool_{i}(query, limit): looks up {name} record {i} and returns at most "
                 f"`limit` matching rows as JSON, newest first.\n")
        i += 1
    return tokenizer.encode(text)[:num_tokens]


def bimodal_requests(tokenizer, num_requests: int, seed: int = 0, system_tokens: int = 128,
                     max_prompt: int = 380) -> list[Request]:
    """Two kinds of prompt, in a seeded mix: short questions (log-normal around 33 tokens)
    and long documents (200-330 tokens), and about half of each behind one shared system
    prompt of `system_tokens` (prefix caching's case), cut to `max_prompt` tokens; short
    answers. The simulator's held-out shape (simulator/calibrate.py, validation_workloads)."""
    rng = np.random.default_rng(seed)
    system = tool_catalog_prompt(tokenizer, "InventoryBot", system_tokens)
    short = lognormal_requests(tokenizer, num_requests, prompt=(3.5, 0.4, 16, 60),
                               output=(3.0, 0.5, 4, 40), seed=seed)
    long = lognormal_requests(tokenizer, num_requests, prompt=(5.6, 0.2, 200, 330),
                              output=(2.5, 0.5, 4, 30), seed=seed + 1)
    out = []
    for s, d in zip(short, long):
        r = d if rng.random() < 0.5 else s
        if rng.random() < 0.5:
            r.prompt = (system + list(r.prompt))[:max_prompt]
        out.append(r)
    return out


def shared_prefix_requests(tokenizer, num_questions: int, prefix_tokens: int = 1024,
                           max_tokens: int = 16) -> list[Request]:
    """One long system prompt, many different questions behind it, as a server sees them once
    the prompt is warm: the first request arrives alone, the rest one step later, when its
    prompt has been prefilled and its full blocks cached (if the token budget holds it)."""
    system = tool_catalog_prompt(tokenizer, "InventoryBot", prefix_tokens)
    return [Request(system + tokenizer.encode(
        f"\nUser {i}: which tool tells me how many units of item {1000 + 37 * i} are left in "
        f"warehouse {i % 7}?\nAgent:"), _greedy(max_tokens), arrival_step=int(i > 0))
        for i in range(num_questions)]


def conversation_requests(tokenizer, num_turns: int, prefix_tokens: int = 512,
                          max_tokens: int = 16) -> list[Request]:
    """A chat that grows: each turn's prompt is the whole history (system prompt, earlier
    messages and answers) plus the next message, so each turn's prefix is cached."""
    system = tool_catalog_prompt(tokenizer, "TravelAgent", prefix_tokens)
    turns = []
    for i in range(num_turns):
        msg = tokenizer.encode(f"\nTraveller: step {i + 1}: now check option "
                               f"{chr(65 + i % 26)} for day {i + 2} and tell me the price."
                               "\nAgent:")
        turns.append(Request(system + msg if i == 0 else msg, _greedy(max_tokens),
                             follows=i - 1 if i else None))
    return turns


def multi_turn_requests(tokenizer, num_conversations: int, num_turns: int,
                        system_tokens: int = 256, max_tokens: int = 16,
                        think_time: float = 0.0) -> list[Request]:
    """Several chats at once, each with a system prompt of its own: every turn resends its
    chat's whole history (earlier messages and answers) plus the next message, so a turn's
    prefix was computed by the turn before, unless the cache dropped it meanwhile; the user
    sends it think_time seconds after the last answer. Requests are conversation-major: turn
    t of chat c is request c * num_turns + t."""
    requests = []
    for c in range(num_conversations):
        system = tool_catalog_prompt(tokenizer, f"Assistant{c}", system_tokens)
        for t in range(num_turns):
            msg = tokenizer.encode(f"\nUser {c}: question {t + 1}: what about item "
                                   f"{100 * c + t} in aisle {t + 3}?\nAssistant:")
            requests.append(Request(system + msg if t == 0 else msg, _greedy(max_tokens),
                                    arrival_time=think_time if t else 0.0,
                                    follows=len(requests) - 1 if t else None))
    return requests


def mixed_requests(tokenizer, num_requests: int, seed: int = 0, system_tokens: int = 160,
                   long_prompt=(320, 420)) -> list[Request]:
    """A server's mix, in a seeded order (the capstone's workload): half the requests behind
    one shared system prompt, the rest split between "repeat this text" (the answer is in the
    prompt: speculation's case), JSON answers under a schema (structured output) and long
    prompts (a document to summarise). Greedy; EOS ignored except for JSON, which ends."""
    rng = np.random.default_rng(seed)
    system = tool_catalog_prompt(tokenizer, "InventoryBot", system_tokens)
    words = COPY_TEXT.split()
    doc = _token_source(tokenizer, long_prompt[1] + 64, FILLER + COPY_TEXT)
    schema = {"type": "object", "properties": {"item": {"type": "string"},
              "count": {"type": "integer"}}, "required": ["item", "count"]}
    kinds = rng.permutation(["system"] * (num_requests // 2) + [
        ("copy", "json", "long")[i % 3] for i in range(num_requests - num_requests // 2)])
    requests = []
    for i, kind in enumerate(kinds):
        w = int(rng.integers(0, len(words) - 50))
        if kind == "system":
            prompt = system + tokenizer.encode(
                f"\nUser {i}: how many units of item {int(rng.integers(1000, 9999))} are left "
                f"in warehouse {int(rng.integers(1, 9))}?\nAgent:")
            params = _greedy(rng.integers(12, 33))
        elif kind == "copy":
            prompt = chat_prompt(tokenizer,
                                 f"{COPY_EDITS[i % 4]}:\n\n" + " ".join(words[w:w + 40]))
            params = _greedy(rng.integers(24, 41))
        elif kind == "json":
            prompt = chat_prompt(tokenizer, f"Reply in JSON: the item and how many are left of "
                           f"item {int(rng.integers(1000, 9999))}.")
            params = SamplingParams(temperature=0, max_tokens=24,
                                    guided_decoding={"json": schema})
        else:
            start = int(rng.integers(0, 64))
            prompt = doc[start:start + int(rng.integers(*long_prompt))]
            params = _greedy(rng.integers(8, 17))
        requests.append(Request(prompt, params))
    return requests


def synthetic_requests(num_requests: int, prompt=(6.0, 0.8, 16, 4000), output=(5.0, 0.8, 4,
                       1000), vocab_size: int = 32000, shared_prefix: int = 0, seed: int = 0
                       ) -> list[Request]:
    """Requests made of lengths only, for models not on this machine: prompt and output are
    (mu, sigma, min, max) of a clipped log-normal, as workloads.lognormal_requests; prompt
    tokens are random ids (no two prompts share a block) behind `shared_prefix` tokens that
    every request shares (a system prompt: prefix caching's case). Greedy, EOS ignored."""
    rng = np.random.default_rng(seed)
    prompt_lens = np.clip(rng.lognormal(*prompt[:2], num_requests), *prompt[2:]).astype(int)
    output_lens = np.clip(rng.lognormal(*output[:2], num_requests), *output[2:]).astype(int)
    prefix = rng.integers(3, vocab_size, shared_prefix).tolist()
    return [Request(prefix + rng.integers(3, vocab_size, int(p)).tolist(),
                    SamplingParams(temperature=0, max_tokens=int(o), ignore_eos=True))
            for p, o in zip(prompt_lens, output_lens)]


def chat_turns(num_chats: int, num_turns: int, system_tokens: int = 512,
               turn_tokens: int = 128, max_tokens: int = 64, rate: float = 4.0,
               think_time: float = 5.0, vocab_size: int = 32000, seed: int = 0
               ) -> list[Request]:
    """Multi-turn chats made of token ids, for the simulator (which cannot feed an answer
    back: each turn's prompt is its chat's system prompt and every user message so far, so
    turn t's prompt starts with turn t - 1's). Chats start as Poisson arrivals at `rate` a
    second, each turn `think_time` seconds after the last began, interleaved across chats;
    seeded. Greedy, EOS ignored."""
    rng = np.random.default_rng(seed)
    starts = np.cumsum(rng.exponential(1 / rate, num_chats))
    requests = []
    for c in range(num_chats):
        history = rng.integers(3, vocab_size, system_tokens).tolist()
        for t in range(num_turns):
            history = history + rng.integers(3, vocab_size, turn_tokens).tolist()
            requests.append(Request(history, _greedy(max_tokens),
                                    arrival_time=float(starts[c] + t * think_time)))
    return sorted(requests, key=lambda r: r.arrival_time)


def poisson_arrivals(requests: list[Request], rate: float, seed: int = 0,
                     unit: str = "seconds") -> list[Request]:
    """Open-loop arrivals: exponential gaps at `rate` requests per second (inf: all at once),
    the first at 0. unit="steps": `rate` requests per engine step, each arriving before the
    step its running sum of gaps falls in (arrival_step), the same on every machine."""
    if unit not in ("seconds", "steps"):
        raise ValueError(f"unit must be 'seconds' or 'steps', got {unit!r}")
    rng = np.random.default_rng(seed)
    t = 0.0
    for r in requests:
        if unit == "steps":
            r.arrival_step = int(t)
        else:
            r.arrival_time = t
        t += 0.0 if rate == float("inf") else rng.exponential(1 / rate)
    return requests


@dataclass(slots=True)
class ServeResult:
    """What `serve` saw: the finished outputs (in request order) and every step."""

    outputs: list[RequestOutput]
    steps: list[StepRecord]
    elapsed: float                                   # seconds, first step to last
    finish_step: list[int] = field(default_factory=list)   # step each request finished in
    # Steps are counted from 1; a request added when the engine had run k steps arrived at k.
    arrival_step: list[int] = field(default_factory=list)  # step count when it was added
    token_steps: list[list[int]] = field(default_factory=list)  # step of each output token
    arrival_time: list[float] = field(default_factory=list)     # perf_counter when it arrived

    @property
    def num_output_tokens(self) -> int:
        return sum(len(c.token_ids) for o in self.outputs for c in o.outputs)

    @property
    def output_throughput(self) -> float:
        """Output tokens per second."""
        return self.num_output_tokens / self.elapsed if self.elapsed else 0.0

    @property
    def ttfts(self) -> list[float]:
        """Time to first token, seconds, from each request's arrival (docs/glossary.md): with
        arrival times, the moment it was due, though the engine took it at the next step."""
        return [None if o.metrics.first_token_time is None else o.metrics.first_token_time - t
                for o, t in zip(self.outputs, self.arrival_time)]

    @property
    def ttft_steps(self) -> list[int]:
        """Time to first token in engine steps: the steps a request lived through, up to and
        including the one that produced its first token (1: the first step it was in)."""
        return [t[0] - a if t else None for t, a in zip(self.token_steps, self.arrival_step)]

    @property
    def kv_utilization(self) -> float:
        """Tokens held / KV slots reserved, summed over the steps."""
        held = sum(s.stats.tokens_cached for s in self.steps)
        return held / max(sum(s.stats.slots_reserved for s in self.steps), 1)


# --8<-- [start:serve]
def serve(llm, requests: list[Request], tag: str = "req-") -> ServeResult:
    """Serve `requests` through an LLM or LLMEngine, one step at a time, and record it.

    A request joins when its arrival step and arrival time have come (with `follows`, its
    arrival time counts from the end of the request it continues). An engine with nothing to
    do jumps to the next arrival step, and waits for the next arrival time. Steps are the
    core's; with the core in its own process (data parallelism: several), the front end's
    calls to step().
    """
    engine = getattr(llm, "engine", llm)
    calls = 0                                # the front end's steps
    num_steps = ((lambda: calls) if getattr(engine, "multiprocess_mode", False)  # noqa: E731
                 else (lambda: engine.num_steps))
    done: dict[int, RequestOutput] = {}
    finished_at: dict[int, float] = {}       # seconds after the start
    finish_step: dict[int, int] = {}
    arrival_step = [0] * len(requests)
    arrival_time = [0.0] * len(requests)
    token_steps: list[list[int]] = [[] for _ in requests]
    pending = list(range(len(requests)))
    start_step = num_steps()
    t0 = time.perf_counter()

    def due(i: int) -> float:
        r = requests[i]
        return r.arrival_time + (0.0 if r.follows is None else finished_at[r.follows])

    def ready(i: int, now: float, step: int) -> bool:
        r = requests[i]
        return (r.arrival_step <= step and (r.follows is None or r.follows in done)
                and due(i) <= now)

    with engine.trace() as steps:
        while pending or engine.has_unfinished_requests():
            now = time.perf_counter() - t0
            step = num_steps() - start_step
            if not engine.has_unfinished_requests() and not any(ready(i, now, step)
                                                                for i in pending):
                nxt = min((i for i in pending if requests[i].follows is None
                           or requests[i].follows in done), key=due)
                time.sleep(max(0.0, due(nxt) - now))              # idle until it arrives
                now, step = max(now, due(nxt)), max(step, requests[nxt].arrival_step)
            for i in [i for i in pending if ready(i, now, step)]:
                r = requests[i]
                prompt = r.prompt
                if r.follows is not None:       # the chat so far, then this message
                    prev = done[r.follows]
                    prompt = prev.prompt_token_ids + prev.outputs[0].token_ids + list(prompt)
                arrival_time[i] = (t0 + due(i) if r.arrival_time
                                   else time.perf_counter())     # due then, or added now
                arrival_step[i] = num_steps() - start_step
                engine.add_request(f"{tag}{i}", prompt, r.params)
                pending.remove(i)
            outs = engine.step()
            calls += 1
            for out in outs:
                i = int(out.request_id.removeprefix(tag))
                k = num_steps() - start_step
                new_tokens = len(out.outputs[0].token_ids) - len(token_steps[i])
                token_steps[i] += [k] * new_tokens
                if out.finished:
                    done[i] = out
                    finished_at[i] = time.perf_counter() - t0
                    finish_step[i] = k
    return ServeResult(outputs=[done[i] for i in range(len(requests))], steps=steps,
                       elapsed=time.perf_counter() - t0,
                       finish_step=[finish_step[i] for i in range(len(requests))],
                       arrival_step=arrival_step, token_steps=token_steps,
                       arrival_time=arrival_time)
# --8<-- [end:serve]
