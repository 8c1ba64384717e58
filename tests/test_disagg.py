"""Prefill/decode disaggregation (minivllm/distributed/kv_transfer/kv_connector.py): two real processes over gloo.

Each process test costs a spawn and a model load, so one launch checks many things. Every
wait is bounded: the roles' own timeouts, and a timeout on every subprocess wait.
"""

import argparse
import dataclasses
import os
import subprocess
import sys

import pytest

from conftest import engine_config, gpu
from minivllm import LLM, SamplingParams
from minivllm.entrypoints.cli import make_engine
from minivllm.entrypoints.openai.cli_args import make_arg_parser
from minivllm.engine.disagg.disagg_llm import DisaggLLM, free_port, launch
from minivllm.core.kv_cache import kv_bytes_per_token

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def start_consumer(path, port, *flags):
    """The decode role as its own command, as on a second machine (here over loopback)."""
    cmd = [sys.executable, "-m", "minivllm.entrypoints.cli", "disagg", str(path), "--role", "consumer",
           "--kv-ip", "127.0.0.1", "--kv-port", str(port), "--timeout", "120", *flags]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def finish(proc, timeout=60) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate(timeout=10)
    return out


def test_disaggregated_greedy_equals_colocated_and_sends_the_uncached_prompt_kv(smol_llm,
                                                                                smol_path):
    """Real model. Prompt lengths on and off the 16-token block boundary, all in flight at
    once, two pairs sharing a 32-token prefix (prefix caching on both sides)."""
    tok = [int(t) for t in smol_llm.tokenizer.encode(" ".join(["KV blocks move"] * 40))]
    prompts = [tok[:n] for n in (1, 15, 16, 17, 32, 47)]
    prompts += [tok[:32] + [28, 29, 30], tok[:32] + [40, 41, 42, 43, 44]]
    greedy = dataclasses.replace(GREEDY, logprobs=2)    # the first token's travel with its KV
    colocated = smol_llm.generate(prompts, greedy, use_tqdm=False)
    with launch(str(smol_path), max_model_len=256, num_kv_blocks=64) as llm:
        outs = llm.generate(prompts[:6], greedy)    # then the pairs: their prefix is cached
        consumer_hits = -llm.consumer_report()["stats"]["prefix_cache_hit_tokens"]
        first_bytes = llm.stats()["bytes_sent"]
        outs += llm.generate(prompts[6:], greedy)
        last_report = llm.consumer_report()
        consumer_hits += last_report["stats"]["prefix_cache_hit_tokens"]
        sent = llm.stats()
        producer_hits = llm.producer.stats().prefix_cache_hit_tokens
    report = llm.report                     # the final one, sent as the consumer stopped
    assert report is not last_report and report["num_received"] == len(prompts)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in colocated]
    assert [o.outputs[0].text for o in outs] == [o.outputs[0].text for o in colocated]
    for o, c in zip(outs, colocated):     # a logprobs entry per token, the first one included
        got, want = o.outputs[0].logprobs, c.outputs[0].logprobs
        assert len(got) == len(want) == len(o.outputs[0].token_ids)
        assert all(g.keys() == w.keys() and all(abs(g[t] - w[t]) < 1e-3 for t in g)
                   for g, w in zip(got, want))
    # Bytes: each prompt token's K and V, every layer, once (no padding of the last block),
    # less the tokens the consumer's prefix cache held when the prompt arrived: the two pairs
    # came after the first six had finished there, so only their last 3 and 5 tokens moved.
    # (Within the first six, a prompt may or may not find its predecessors' blocks cached.)
    per_token = kv_bytes_per_token(smol_llm.engine.model_config.hf_config, smol_llm.engine.dtype)
    assert sent["bytes_sent"] == report["bytes_received"] == (
        sum(map(len, prompts)) - sent["cached_tokens_not_sent"]) * per_token
    assert sent["bytes_sent"] - first_bytes == (3 + 5) * per_token
    assert 0 < first_bytes <= sum(map(len, prompts[:6])) * per_token
    assert sent["num_transfers"] == report["num_received"] == len(prompts)
    assert sent["num_reprefilled"] == 0 and sent["connected"] and report["error"] is None
    # The decode side never prefilled, and returned every block it took.
    assert report["num_prefill_steps"] == 0 and report["num_steps"] >= GREEDY.max_tokens - 1
    # ... so no decode there waited through a step larger than one token per running request.
    assert 1 <= report["largest_decode_step_tokens"] <= len(prompts)
    assert report["num_referenced_blocks"] == 0
    assert report["num_free_blocks"] == report["num_blocks"] == 64
    # Prefix caching on both sides: the pairs found their 32-token prefix cached on the
    # producer and on the consumer (whose hits within the first six depend on the order they
    # arrived in). The producer prefilled the first six in one step, in order, and a block is
    # named as it is scheduled: 17 and 32 found the 16's first block, 47 the 32's two.
    assert consumer_hits == 2 * 32
    assert producer_hits == 2 * 32 + 16 + 16 + 32
    assert all(o.metrics.ttft > 0 and len(o.inter_token_latencies) == 7 for o in outs)


def test_consumer_on_its_own_command_refusal_and_death_lose_no_request(tiny_checkpoint):
    """The two-machine path (roles started apart, address and port given), over loopback.
    A request the decode side can never hold is refused there and prefilled again on the
    producer; when the decode process dies, the requests it held are prefilled again and
    decoded on the producer. Greedy outputs stay those of one colocated engine."""
    path, _ = tiny_checkpoint("llama")
    settings = dict(max_model_len=128, max_num_seqs=8)
    short = [[5 + i, 17, 99, 4 + i] * (i + 1) for i in range(4)]          # 4..16 tokens
    long_prompt = " ".join(["the long prompt that the decode side refuses"] * 7)  # 56 tokens:
    # 56 + 30 > 64 slots; given as text, which the producer's second prefill keeps
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    reference = LLM(str(path), **settings).generate(short + [long_prompt], params,
                                                    use_tqdm=False)
    port = free_port()
    consumer = start_consumer(path, port, "--max-model-len", "128", "--max-num-seqs", "8",
                              "--num-gpu-blocks-override", "4")             # 64 KV slots
    try:
        llm = DisaggLLM(str(path), kv_port=port, timeout=120, **settings)
        first = llm.generate(short + [long_prompt], params)
        assert llm.num_reprefilled == 1 and llm.connected     # the long one, refused
        assert first[-1].prompt == long_prompt
        # Now kill the decode role while it holds requests.
        for i, p in enumerate(short):
            llm.add_request(f"late-{i}", p, params)
        while len(llm.remote) < len(short):
            llm.step()
        consumer.kill()
        done = {}
        while llm.has_unfinished_requests():
            done.update({o.request_id: o for o in llm.step() if o.finished})
        assert not llm.connected and "lost" in llm.error
        assert llm.num_reprefilled > 1                   # at least one held by the dead role
        assert llm.producer.stats().num_blocks_used == 0
        llm.close()
    finally:
        out = finish(consumer)
    ids = lambda outs: [o.outputs[0].token_ids for o in outs]  # noqa: E731
    assert ids(first) == ids(reference)
    assert ids(done[f"late-{i}"] for i in range(len(short))) == ids(reference[:len(short)])
    assert "KV pool" in out                    # the consumer did start and load


def test_bad_kv_transfer_config_is_refused_at_construction():
    for bad, message in [({}, "needs kv_role"), ({"kv_role": "prefill"}, "kv_role must be"),
                         ({"kv_role": "kv_consumer", "kv_rank": 0}, "kv_rank 1"),
                         ({"kv_role": "kv_producer", "kv_parallel_size": 3}, "must be 2"),
                         ({"kv_role": "kv_producer", "kv_connector": "Nixl"}, "unknown"),
                         ({"kv_role": "kv_producer", "bogus": 1}, "unknown key")]:
        with pytest.raises(ValueError, match=message):
            engine_config(kv_transfer_config=bad)
    with pytest.raises(ValueError, match="paged"):
        engine_config(kv_layout="contiguous", kv_transfer_config={"kv_role": "kv_producer"})
    # `minivllm serve --kv-transfer-config`: the HTTP front is the producer's; checked before
    # any model loads.
    parser = make_arg_parser(argparse.ArgumentParser())
    for flag, message in [('{"kv_role": "kv_consumer"}', "the HTTP front is the kv_producer"),
                          ('{"kv_role": "kv_producer", "kv_port": 0}', "kv_port must be")]:
        with pytest.raises(ValueError, match=message):
            make_engine(parser.parse_args(["--kv-transfer-config", flag]))


def test_mismatched_or_missing_peer_is_refused_at_start(tiny_checkpoint):
    llama, _ = tiny_checkpoint("llama")
    qwen, _ = tiny_checkpoint("qwen2")
    # No kv_consumer ever joins: a clear error after the timeout, not a hang.
    with pytest.raises(RuntimeError, match="no kv_consumer joined"):
        DisaggLLM(str(llama), kv_port=free_port(), timeout=2)
    # A consumer with another model and another block size: both sides refuse, naming both.
    port = free_port()
    consumer = start_consumer(qwen, port, "--block-size", "32")
    try:
        with pytest.raises(RuntimeError, match="refusing to pair") as e:
            DisaggLLM(str(llama), kv_port=port, timeout=120)
        assert "block_size: 16 here, 32 there" in str(e.value) and "model:" in str(e.value)
    finally:
        out = finish(consumer)
    assert consumer.returncode != 0 and "refusing to pair" in out


@gpu
def test_pair_on_cuda_matches_colocated(tiny_checkpoint):
    """On a GPU: one GPU sends the KV through host memory over gloo (NCCL refuses two ranks
    on one device); with two GPUs the consumer gets cuda:1 and the KV goes over NCCL."""
    path, _ = tiny_checkpoint("llama")
    prompts = [[5 + i, 17, 99] * (i + 2) for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    settings = dict(dtype="float32", max_model_len=128, num_kv_blocks=32)
    reference = LLM(str(path), **settings).generate(prompts, params, use_tqdm=False)
    with launch(str(path), **settings) as llm:
        outs = llm.generate(prompts, params)
        sent = llm.stats()
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in reference]
    assert sent["bytes_sent"] == llm.report["bytes_received"] > 0
    assert sent["num_reprefilled"] == 0 and llm.report["num_referenced_blocks"] == 0


EXIT_SCRIPT = """
import atexit, sys
from minivllm import SamplingParams
from minivllm.engine.disagg.disagg_llm import launch
if __name__ == "__main__":
    # atexit runs last-in first-out: registered before the pair, this runs after its hook
    atexit.register(lambda: print("at exit: connected", pair.connected, "receiver alive",
                                  pair.conn.receiver.is_alive(), flush=True))
    pair = launch(sys.argv[1], max_model_len=128, max_num_seqs=4, num_kv_blocks=32)
    out = pair.generate([[5, 17, 99, 4]], SamplingParams(temperature=0, max_tokens=4))
    print("generated", len(out[0].outputs[0].token_ids), flush=True)
"""


def test_a_pair_left_open_is_closed_at_exit(tiny_checkpoint, tmp_path):
    """Lesson 08 ends without close(): the process must still exit 0, without "terminate
    called without an active exception" (gloo torn down under a thread still receiving):
    the pair closes itself at exit, and its receiving thread has returned."""
    path, _ = tiny_checkpoint("llama")
    script = tmp_path / "open_pair.py"
    script.write_text(EXIT_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(path)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "generated 4" in proc.stdout
    assert "at exit: connected False receiver alive False" in proc.stdout, proc.stdout
    assert "terminate called" not in proc.stderr and "Traceback" not in proc.stderr
