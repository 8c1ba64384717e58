"""Pipeline parallelism (minivllm/distributed/pipeline.py) over gloo on this CPU: the layers
split into stages as vLLM splits them, each stage holding only its layers' weights and KV; pp=2,
pp=3 and tp x pp give the tokens one process gives (greedy and seeded); the engine core keeps
up to pp batches in flight, never the same request in two, and an abort or a preemption in the
middle of that loses no block.

A pipeline engine starts a process per rank (seconds each), so the tiny Llama's pp=2 engine is
shared by the module; the SmolLM2 ones start once each."""

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.config import HfConfig
from minivllm.distributed.pipeline import get_pp_indices, split_for_stage
from minivllm.models import LlamaForCausalLM
from minivllm.models.llama import PPMissingLayer

from conftest import PROMPTS, engine_config, reconfigured

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
SMALL = dict(max_model_len=256, num_kv_blocks=64)


def token_ids(llm, prompts, params=GREEDY):
    return [[o.token_ids for o in out.outputs]
            for out in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def tiny_pp2(tiny_checkpoint):
    path, _ = tiny_checkpoint("llama")
    llm = LLM(str(path), pipeline_parallel_size=2, **SMALL)
    yield path, llm, LLM(str(path), **SMALL)
    llm.engine.shutdown()


@pytest.mark.parametrize("layers, pp, sizes", [
    (30, 2, [15, 15]), (30, 4, [7, 8, 8, 7]), (32, 3, [11, 11, 10]), (2, 2, [1, 1]),
    (80, 3, [27, 27, 26])])
def test_layers_split_as_vllm_splits_them(layers, pp, sizes):
    """num_layers // pp each; the remainder one apiece to the stages before the last (which
    also computes the logits); contiguous and covering every layer once."""
    ranges = [get_pp_indices(layers, stage, pp) for stage in range(pp)]
    assert [end - start for start, end in ranges] == sizes
    assert ranges[0][0] == 0 and ranges[-1][1] == layers
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


def test_a_stage_holds_its_layers_only():
    config = HfConfig(architecture="LlamaForCausalLM", vocab_size=100, hidden_size=16,
                      intermediate_size=32, num_hidden_layers=5, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=4, max_position_embeddings=64,
                      rms_norm_eps=1e-5, rope_theta=1e4, tie_word_embeddings=True)
    held = []
    for stage in range(3):
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
        kv_config = split_for_stage(model, config, stage, 3, config)
        names = {n.rpartition(".")[0] for n, _ in model.named_parameters()}
        layers = sorted({int(n.split(".")[2]) for n in names if n.startswith("model.layers.")})
        held.append(layers)
        assert kv_config.num_hidden_layers == len(layers) == len(model.attention_layers())
        assert ("model.embed_tokens" in names) == (stage in (0, 2))    # last: the tied head
        assert ("model.norm" in names) == (stage == 2)
        assert isinstance(model.lm_head, PPMissingLayer) == (stage != 2)   # tied: no name
    assert held == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="more stages than the model has layers"):
        split_for_stage(model, config, 0, 6, config)


@pytest.mark.parametrize("option", [
    {"quantization": "int8"}, {"enable_lora": True}, {"compilation_config": 3},
    {"speculative_config": {"num_speculative_tokens": 2}},
    {"kv_transfer_config": {"kv_role": "kv_producer"}}])
def test_options_pp_does_not_combine_with_are_refused_by_the_config(option):
    name = next(iter(option))
    with pytest.raises(ValueError,
                       match=f"^{name} with pipeline_parallel_size > 1 is not supported"):
        engine_config(pipeline_parallel_size=2, **option)
    with pytest.raises(ValueError, match="pipeline_parallel_size must be a positive integer"):
        engine_config(pipeline_parallel_size=0)
    with pytest.raises(ValueError, match="'uni' is one process"):
        engine_config(pipeline_parallel_size=2, distributed_executor_backend="uni")


def test_pp2_greedy_and_seeded_match_one_process(tiny_pp2):
    path, pp2, pp1 = tiny_pp2
    assert token_ids(pp2, PROMPTS[:4]) == token_ids(pp1, PROMPTS[:4])
    seeded = SamplingParams(n=2, temperature=0.8, seed=11, max_tokens=10)
    assert token_ids(pp2, PROMPTS[:3], seeded) == token_ids(pp1, PROMPTS[:3], seeded)
    runner = pp2.engine.runner                      # the driver: the last stage
    assert runner.pp.stage == 1 and runner.is_driver and runner.kv_cache.shape[0] == 1
    assert [r["total"] > 0 for r in pp2.engine.model_executor.rank_weight_bytes] == [True] * 2
    with pytest.raises(ValueError, match="pipeline_parallel_size is fixed"):
        pp2.reconfigure(pipeline_parallel_size=1)


def test_batches_in_flight_are_micro_batches_of_different_requests(tiny_pp2):
    """Prompts in chunks of 8 tokens: while one batch is in the pipeline the core starts the
    next, of other requests (a request in flight is not scheduled again); the tokens are one
    process's; what crossed between the stages is every step's (tokens, hidden) once."""
    path, pp2, pp1 = tiny_pp2
    chunks = dict(max_num_batched_tokens=8, max_num_seqs=4)
    with reconfigured(pp1, **chunks):
        expected = token_ids(pp1, PROMPTS[2:6])
    pp = pp2.engine.model_executor.pp
    received = pp.recv_bytes                        # the driver is the last stage
    with reconfigured(pp2, **chunks), pp2.engine.trace() as steps:
        assert token_ids(pp2, PROMPTS[2:6]) == expected
    ends = [s.start_time + s.duration for s in steps]
    overlapping = [(a, b) for a, b, end in zip(steps, steps[1:], ends) if b.start_time < end]
    assert len(overlapping) >= 3                    # the next batch began before this one ended
    for a, b in overlapping:
        assert not {s.request_id for s in a.scheduled} & {s.request_id for s in b.scheduled}
    tokens = sum(s.num_batched_tokens for s in steps)
    assert pp.recv_bytes - received == tokens * 64 * 4   # hidden 64, fp32, once a step
    assert pp2.engine.block_manager.num_free_blocks == pp2.engine.block_manager.num_blocks


def test_abort_and_preemption_in_flight_lose_no_block(tiny_pp2):
    """A request aborted while its batch is in the pipeline is forgotten by the workers once
    the batch is back; a pool too small for 6 sequences preempts (never a request in flight)
    and the tokens are still one process's."""
    path, pp2, pp1 = tiny_pp2
    engine = pp2.engine
    engine.add_request("gone", PROMPTS[0], GREEDY)
    engine.add_request("kept", PROMPTS[1], GREEDY)
    engine.step()                                   # the batch starts; nothing is back yet
    assert engine.scheduler.in_flight
    engine.abort_request("gone")
    outputs = {}
    for _ in range(200):
        if not engine.has_unfinished_requests():
            break
        outputs.update({o.request_id: o for o in engine.step() if o.finished})
    assert list(outputs) == ["kept"]
    assert [outputs["kept"].outputs[0].token_ids] == token_ids(pp1, PROMPTS[1:2])[0]
    for _ in range(3):                 # the next step's message tells the runner (in flight)
        engine.core.step()
    assert set(engine.runner.requests) == set()
    # (a budget of 3 tokens: two micro-batches of 3 decodes, so batches overlap in decode too)
    small = dict(num_kv_blocks=20, block_size=4, max_num_seqs=6, max_num_batched_tokens=3)
    prompts = [f"Tell me about number {i} and why it matters" for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    with reconfigured(pp1, **small):
        expected = token_ids(pp1, prompts, params)
    with reconfigured(pp2, **small), pp2.engine.trace() as steps:
        assert token_ids(pp2, prompts, params) == expected
        assert sum(len(s.preempted) for s in steps) > 0
        bm = pp2.engine.block_manager
        assert bm.num_free_blocks == bm.num_blocks and not pp2.engine.scheduler.in_flight
    # A batch's schedule never preempted a request of the batch still in flight before it.
    ends = [s.start_time + s.duration for s in steps]
    overlapping = [(a, b) for a, b, end in zip(steps, steps[1:], ends) if b.start_time < end]
    assert overlapping and all(not set(b.preempted) & {s.request_id for s in a.scheduled}
                               for a, b in overlapping)


def test_beam_search_in_the_core_is_refused_under_pp(tiny_pp2):
    from minivllm import BeamSearchParams
    _, pp2, _ = tiny_pp2
    with pytest.raises(ValueError, match="pipeline parallelism"):
        pp2.beam_search([PROMPTS[0]], BeamSearchParams(beam_width=2, max_tokens=4),
                        method="fork")
    assert not pp2.engine.has_unfinished_requests()


def test_pp3_and_tp3_x_pp2_match_one_process_on_smollm2(smol_llm, smol_path):
    """The default model's 30 layers in 3 stages of 10, then in 2 stages of 3 tensor ranks
    each (6 processes; 9 query heads and 3 KV heads, one KV head a rank)."""
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    expected = token_ids(smol_llm, PROMPTS[:3], params)
    for split in (dict(pipeline_parallel_size=3),
                  dict(tensor_parallel_size=3, pipeline_parallel_size=2)):
        llm = LLM(str(smol_path), max_model_len=256, num_kv_blocks=32, **split)
        try:
            layers = 30 // split["pipeline_parallel_size"]
            assert llm.engine.runner.kv_cache.shape[0] == layers
            assert token_ids(llm, PROMPTS[:3], params) == expected
        finally:
            llm.engine.shutdown()


def test_pp2_across_two_hosts_matches_one_process(tiny_checkpoint, two_hosts, monkeypatch):
    """Stage 1 (the driver) here on 10.99.0.1, stage 0 on the other host (a network namespace,
    `serve --headless --nnodes 2 --node-rank 1`): the hidden states cross the veth pair every
    step, and the tokens are one process's. Gloo binds where GLOO_SOCKET_IFNAME says (on a
    real cluster too: the interface the hosts share)."""
    import random
    import subprocess
    import sys
    path, _ = tiny_checkpoint("llama")
    expected = token_ids(LLM(str(path), **SMALL), PROMPTS[:4])
    port = random.randrange(20000, 40000, 4)
    node1 = subprocess.Popen(
        ["ip", "netns", "exec", two_hosts, "env", "GLOO_SOCKET_IFNAME=mvh2", sys.executable,
         "-m", "minivllm.entrypoints.cli", "serve", "--headless", "--nnodes", "2",
         "--node-rank", "1", "--master-addr", "10.99.0.1", "--master-port", str(port)])
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "mvh1")
    try:
        llm = LLM(str(path), pipeline_parallel_size=2, nnodes=2, master_addr="10.99.0.1",
                  master_port=port, **SMALL)
        try:
            assert llm.engine.runner.pp.stage == 1 and not llm.engine.model_executor.workers
            received = llm.engine.model_executor.pp.recv_bytes
            assert token_ids(llm, PROMPTS[:4]) == expected
            assert llm.engine.model_executor.pp.recv_bytes > received     # from node 1
            with pytest.raises(ValueError, match="engine runs on node 0"):
                engine_config(pipeline_parallel_size=2, nnodes=2, node_rank=1)
        finally:
            llm.engine.shutdown()
        assert node1.wait(timeout=30) == 0            # its worker left when told to
    finally:
        if node1.poll() is None:
            node1.kill()
