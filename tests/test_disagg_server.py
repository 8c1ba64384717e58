"""A disaggregated pair behind the OpenAI-compatible server (`minivllm serve
--kv-transfer-config ...`): the producer and the front in this process, the consumer in a
spawned one, the official `openai` client over loopback. One launch for the file (a spawn and a
model load); every wait is bounded (the pair's timeout, the client's, the joins')."""

from concurrent.futures import ThreadPoolExecutor

import openai

from conftest import PROMPTS
from minivllm import SamplingParams
from minivllm.engine.async_llm_engine import AsyncLLMEngine
from minivllm.engine.disagg.disagg_llm import launch
from minivllm.core.kv_cache import kv_bytes_per_token
from minivllm.entrypoints.openai.api_server import DisaggFront, Server, bind_socket

MAX_TOKENS = 12
SEEDED = [(PROMPTS[0], 7), (PROMPTS[1], 8), (PROMPTS[1], 9)]
LONG = " ".join(PROMPTS[:4])                  # over two KV blocks


def test_pair_behind_the_openai_server_streams_what_one_engine_generates(smol_llm, smol_path):
    """Eight streams at once, greedy: the text of one colocated engine, token for token, sent
    in pieces. Seeded sampling: the same tokens as colocated (the generator moved with the
    first token); n=3 fans out into three requests, sampled as the engine samples its three.
    A repeated prompt sends only its uncached tail. No KV block stays held, none leaks."""
    prompts = PROMPTS[:7] + [LONG]
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    colocated = [o.outputs[0].text for o in smol_llm.generate(prompts, greedy, use_tqdm=False)]
    seeded = [smol_llm.generate(p, SamplingParams(temperature=0.9, seed=s, max_tokens=MAX_TOKENS),
                                use_tqdm=False)[0].outputs[0].text for p, s in SEEDED]
    parallel = [c.text for c in smol_llm.generate(PROMPTS[2], SamplingParams(
        n=3, temperature=0.9, seed=11, max_tokens=MAX_TOKENS), use_tqdm=False)[0].outputs]
    assert len(set(parallel)) > 1
    pair = launch(str(smol_path), max_model_len=256, num_kv_blocks=64, timeout=120)
    aengine = AsyncLLMEngine(DisaggFront(pair))
    server = Server(aengine, bind_socket("127.0.0.1", 0), "smol", graceful_s=1.0).start()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0,
                           timeout=120, default_headers={"Connection": "close"})

    def stream(prompt: str) -> list[str]:
        chunks = client.completions.create(model="smol", prompt=prompt, max_tokens=MAX_TOKENS,
                                           temperature=0, stream=True)
        return [c.choices[0].text for c in chunks if c.choices]

    try:
        with ThreadPoolExecutor(len(prompts)) as pool:
            pieces = list(pool.map(stream, prompts))
        sampled = [client.completions.create(model="smol", prompt=p, max_tokens=MAX_TOKENS,
                                             temperature=0.9, seed=s).choices[0].text
                   for p, s in SEEDED]
        before = pair.stats()["bytes_sent"]
        again = client.completions.create(model="smol", prompt=LONG, temperature=0,
                                          max_tokens=MAX_TOKENS).choices[0].text
        resent = pair.stats()["bytes_sent"] - before
        multi = client.completions.create(model="smol", prompt=PROMPTS[2], n=3, seed=11,
                                          temperature=0.9, max_tokens=MAX_TOKENS).choices
    finally:
        server.stop()                         # stops the engine loop too (it owns it)
        report = pair.close()
    assert ["".join(p) for p in pieces] == colocated and again == colocated[-1]
    assert sum(len(p) for p in pieces) > 2 * len(prompts)     # streamed, not sent whole
    assert sampled == seeded and sampled[1] != sampled[2]
    n = len(smol_llm.tokenizer.encode(LONG, add_special_tokens=False))
    per_token = kv_bytes_per_token(smol_llm.engine.model_config.hf_config, smol_llm.engine.dtype)
    assert n > 32 and resent == (n - (n - 1) // 16 * 16) * per_token   # full blocks: cached
    assert [c.text for c in sorted(multi, key=lambda c: c.index)] == parallel
    stats = pair.stats()
    assert stats["num_transfers"] == len(prompts) + len(SEEDED) + 1 + 3
    assert stats["bytes_sent"] == report["bytes_received"] and stats["num_reprefilled"] == 0
    assert report["num_prefill_steps"] == 0 and report["num_referenced_blocks"] == 0
    assert report["error"] is None and pair.producer.stats().num_blocks_used == 0
