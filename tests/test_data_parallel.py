"""Data parallelism (engine/multiproc/dp_client.py): two replicas of the engine, each an engine
core in its own process with its own KV pool, behind one front end. Every request's tokens are
one engine's (greedy and seeded); a request goes to the replica with the lowest
4 x waiting + running (vLLM V1's score before 0.33) or, as the baseline, round-robin; its
abort and its stop string reach that replica; stats are the replicas' summed.

The two-replica engine starts two processes that load the weights (seconds each), so it is
shared by the module."""

import pytest

from minivllm import LLM, SamplingParams
from minivllm.benchmarks.routing import rotating_chats
from minivllm.engine.multiproc.dp_client import sum_stats

from conftest import PROMPTS, engine_config

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
SMALL = dict(max_model_len=256, num_kv_blocks=64)


def token_ids(llm, prompts, params=GREEDY):
    return [[o.token_ids for o in out.outputs]
            for out in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def tiny_dp2(tiny_checkpoint):
    path, _ = tiny_checkpoint("llama")
    llm = LLM(str(path), data_parallel_size=2, **SMALL)
    yield llm, LLM(str(path), **SMALL)
    llm.engine.shutdown()


def run_to_end(engine, limit: int = 500) -> dict:
    finished = {}
    for _ in range(limit):
        if not engine.has_unfinished_requests():
            return finished
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    raise AssertionError("the engine did not finish")


def test_dp_size_is_checked_and_fixed():
    with pytest.raises(ValueError, match="data_parallel_size must be a positive integer"):
        engine_config(data_parallel_size=0)
    assert engine_config(data_parallel_size=2).parallel_config.world_size == 1  # per replica


def test_dp2_greedy_and_seeded_match_one_engine(tiny_dp2):
    dp2, one = tiny_dp2
    client = dp2.engine.engine_core
    added = list(client.num_added)
    assert token_ids(dp2, PROMPTS[:6]) == token_ids(one, PROMPTS[:6])
    seeded = SamplingParams(n=2, temperature=0.8, seed=5, max_tokens=10)
    assert token_ids(dp2, PROMPTS[:3], seeded) == token_ids(one, PROMPTS[:3], seeded)
    got = [n - a for n, a in zip(client.num_added, added)]
    assert got == [6, 6]                   # 6 + 3 x 2 samples, spread evenly at once
    assert len(set(client.pids)) == 2 and not client.owner
    with pytest.raises(ValueError, match="data_parallel_size is fixed"):
        dp2.reconfigure(data_parallel_size=1)


@pytest.mark.parametrize("balance, goes_to", [("score", "idle"), ("round_robin", "busy")])
def test_the_score_sends_new_work_to_the_idle_replica(tiny_dp2, balance, goes_to):
    """Long, short, long, short sent round-robin: the longs share a replica, the shorts the
    other. Once the shorts are done that one is idle while the first still runs both longs:
    the score (4 x waiting + running) sends the next request to the idle replica; round-robin
    follows its cycle, back to the busy one."""
    dp2, _ = tiny_dp2
    engine, client = dp2.engine, dp2.engine.engine_core
    # Long: the busy replica must still be running when the front end, a batch at a time,
    # has seen the shorts finish (60 tokens of the tiny model were not always enough in CI).
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    short = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    client.balance = "round_robin"
    try:
        for i, params in enumerate([long, short, long, short]):
            engine.add_request(f"skew-{i}", PROMPTS[i], params)
        busy, idle = client.owner["skew-0"], client.owner["skew-1"]
        assert busy != idle and client.owner["skew-2"] == busy
        assert client.owner["skew-3"] == idle
        done = {}
        for _ in range(200):
            done.update({o.request_id: o for o in engine.step() if o.finished})
            if ({"skew-1", "skew-3"} <= set(done)
                    and client.replicas[idle].stats().num_running == 0):
                break
        assert client.replicas[busy].stats().num_running >= 1       # a long, or both
        assert client.score(idle) == 0 < client.score(busy)
        client.balance = balance
        engine.add_request("next", PROMPTS[4], short)
        assert client.owner["next"] == {"idle": idle, "busy": busy}[goes_to]
        run_to_end(engine)
    finally:
        client.balance = "score"
    assert not client.owner and all(not u for u in client.unseen)


def test_abort_and_stop_strings_reach_the_right_replica(tiny_dp2):
    dp2, one = tiny_dp2
    engine, client = dp2.engine, dp2.engine.engine_core
    engine.add_request("a0", PROMPTS[0], SamplingParams(temperature=0, max_tokens=30,
                                                        ignore_eos=True))
    engine.add_request("a1", PROMPTS[1], SamplingParams(temperature=0, max_tokens=200,
                                                        ignore_eos=True))
    engine.step()
    victim = client.owner["a1"]
    engine.abort_request("a1")
    assert "a1" not in client.owner
    done = run_to_end(engine)
    assert list(done) == ["a0"]
    # Lost, the abort would leave a1 running there for 170 more tokens.
    assert client.replicas[victim].stats(fresh=True).num_blocks_used == 0
    # A stop string found by the front end finishes the request on its replica.
    text = one.generate([PROMPTS[2]], GREEDY, use_tqdm=False)[0].outputs[0].text
    assert len(text) >= 6
    stop = text[3:6]
    out = dp2.generate([PROMPTS[2]], SamplingParams(temperature=0, max_tokens=12, stop=[stop]),
                       use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and stop not in out.text
    stats = client.replica_stats(fresh=True)
    assert sum_stats(stats).num_blocks_used == 0 == sum(s.num_running for s in stats)
    assert sum_stats(stats).num_blocks_total == 2 * 64


def test_prefix_routing_keeps_a_conversation_on_its_replica(tiny_dp2):
    """Three chats of three turns, a round's turns sent together in an order that rotates
    (benchmarks/routing.py's rotating_chats): the load score places a round by arrival order
    alone, so chats change replica and compute their history again; prefix-aware routing,
    reading the replicas' KV events, sends every later turn where its history is cached. The
    tokens are one engine's either way."""
    dp2, one = tiny_dp2
    runs = {}
    try:
        for balance in ("score", "prefix"):
            dp2.reconfigure(kv_events_config={"enable_kv_cache_events": True},
                            data_parallel_balance=balance)
            runs[balance] = rotating_chats(dp2)
    finally:
        dp2.reconfigure(kv_events_config=None, data_parallel_balance="score")
    four = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)   # rotating_chats'
    for run in runs.values():
        prompts = [prompt for prompt, _ in run["sent"]]
        assert token_ids(one, prompts, four) == [[tokens] for _, tokens in run["sent"]]
    score, prefix = runs["score"], runs["prefix"]
    assert any(len(set(r)) > 1 for r in score["where"].values())   # moved, and recomputed
    assert all(len(set(r)) == 1 for r in prefix["where"].values())  # stayed with its history
    assert {r[0] for r in prefix["where"].values()} == {0, 1}       # both replicas used
    assert all(n >= 16 for n in prefix["expected"])                 # the index knew it
    assert prefix["hits"] > score["hits"]
    print(f"replicas per chat: score {score['where']}, prefix {prefix['where']}; prefix-cache "
          f"hit tokens {score['hits']} -> {prefix['hits']}")


def test_the_simulator_routes_as_the_front_end_does(tiny_dp2):
    """Pairs of prompts sent together, each pair once the last is done, on the two real
    replicas and on the simulator set up like them (its cores' own KV events, the same
    Router): every routing decision is the same, under the score and by prefix."""
    from minivllm.benchmarks.workloads import Request
    from minivllm.simulator import simulate
    dp2, _ = tiny_dp2
    client = dp2.engine.engine_core
    docs = [list(range(1000 * d, 1000 * d + 40)) for d in range(4)]   # 2 full blocks each
    pairs = [(0, 1), (1, 0), (2, 0), (3, 2), (1, 3)]
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    events = {"enable_kv_cache_events": True}
    decisions = {}
    try:
        for balance in ("score", "prefix"):
            dp2.reconfigure(kv_events_config=events, data_parallel_balance=balance)
            real = []
            for pair in pairs:
                dp2.generate([docs[d] for d in pair], params, use_tqdm=False)
                real += [c.rank for c in list(client.router.choices)[-2:]]
            sim = simulate([Request(docs[d], params, arrival_time=100.0 * k)
                            for k, pair in enumerate(pairs) for d in pair],
                           model=dp2.engine.model_config.hf_config, profile="H100",
                           data_parallel_size=2, kv_events_config=events,
                           data_parallel_balance=balance, **SMALL)
            assert [c.rank for c in sim.choices] == real, balance
            decisions[balance] = real
    finally:
        dp2.reconfigure(kv_events_config=None, data_parallel_balance="score")
    assert decisions["score"] != decisions["prefix"]
    assert decisions["prefix"][2:4] == [1, 0]            # each document back where it ran


def test_served_over_http_with_metrics_per_replica(tiny_dp2):
    """Last in the module (the server's engine thread drives the engine from here on): the
    OpenAI server over the two replicas answers as one engine does, and /metrics has each
    replica's gauges, labelled engine="0" and "1", beside their sums."""
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    import openai

    from minivllm.engine.async_llm_engine import AsyncLLMEngine
    from minivllm.entrypoints.openai.api_server import Server, bind_socket
    dp2, one = tiny_dp2
    want = [o.outputs[0].text for o in one.generate(PROMPTS[:6], GREEDY, use_tqdm=False)]
    server = Server(AsyncLLMEngine(dp2.engine), bind_socket("127.0.0.1", 0), "tiny",
                    graceful_s=1.0).start()
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0,
                               timeout=120)

        def complete(prompt):
            return client.completions.create(model="tiny", prompt=prompt, max_tokens=12,
                                             temperature=0, extra_body={"ignore_eos": True})
        with ThreadPoolExecutor(6) as pool:
            got = [r.choices[0].text for r in pool.map(complete, PROMPTS[:6])]
        assert got == want
        with urllib.request.urlopen(f"{server.url}/metrics") as r:
            text = r.read().decode()
        for engine in ("0", "1"):
            assert f'minivllm:num_requests_running_by_engine{{engine="{engine}"}}' in text
        assert "minivllm:num_requests_running " in text        # the sum, unlabelled
        assert all(n > 0 for n in dp2.engine.engine_core.num_added)
    finally:
        server.stop()


def test_dp_across_two_hosts_matches_one_engine(tiny_checkpoint, two_hosts):
    """Replica 0 here (10.99.0.1), replica 1 headless in the other namespace (10.99.0.2),
    connected over the veth pair: every request's tokens are one engine's, and both replicas
    served some."""
    import random
    import subprocess
    import sys
    path, _ = tiny_checkpoint("llama")
    port = random.randrange(20000, 40000, 2)
    headless = subprocess.Popen(
        ["ip", "netns", "exec", two_hosts, sys.executable, "-m", "minivllm.entrypoints.cli",
         "serve", "--headless", "--data-parallel-address", "10.99.0.1",
         "--data-parallel-rpc-port", str(port), "--data-parallel-start-rank", "1"])
    try:
        dp = LLM(str(path), data_parallel_size=2, data_parallel_size_local=1,
                 data_parallel_address="10.99.0.1", data_parallel_rpc_port=port, **SMALL)
        try:
            one = LLM(str(path), **SMALL)
            assert token_ids(dp, PROMPTS[:6]) == token_ids(one, PROMPTS[:6])
            client = dp.engine.engine_core
            assert all(n > 0 for n in client.num_added)
            assert client.replicas[1].pid not in (headless.pid, None)   # its pid there
            # The replica's messages came over the pair (the config out, its outputs back).
            received = int(open("/sys/class/net/mvh1/statistics/rx_bytes").read())
            sent = int(open("/sys/class/net/mvh1/statistics/tx_bytes").read())
            assert received > 5_000 and sent > 5_000, (received, sent)
        finally:
            dp.engine.shutdown()
        assert headless.wait(timeout=30) == 0          # the replica left when told to
    finally:
        if headless.poll() is None:
            headless.kill()
