"""Beam search, both designs (minivllm/beam_search.py, vLLM V1's way: one-token requests with
logprobs over the public API; core/v0/beam_group.py, V0's: beams forking block tables in the
engine core), against transformers' `generate(num_beams=k, do_sample=False)` on the same
weights in fp32: the same k sequences, in the same order, with the same scores. The fork
design runs on half the cases (it shares the rules, and CI's time), and once more on a pool
too small for its beams, with chunked prefill, the prefix cache, preemption and an abort,
counting every block's references after every step.

Eight prompts (four chat turns, whose answers end in EOS within the budget, and four plain
continuations), beam widths 2 and 4, early_stopping True, False and "never", and length
penalties 0, 1 and 2. No ties were met on these prompts; a near-tie in the fp32 sums (1e-6) is
the one way the two could disagree and still both be right.
"""

import collections

import pytest
import torch

from minivllm import BeamSearchParams, SamplingParams
from minivllm.beam_search import beam_from_output
from minivllm.config.scheduler import V0_SCHEDULER
from minivllm.engine.core import EngineCoreRequest

from conftest import PROMPTS, reconfigured

MAX_TOKENS = 16
CHATS = ["What is 2+2?", "Name a color.", "Say hi.", "Is the sky blue? Answer yes or no."]
CASES = [(2, True, 1.0), (2, False, 1.0), (2, "never", 1.0), (4, True, 1.0), (4, False, 1.0),
         (4, "never", 1.0), (4, "never", 2.0), (2, False, 0.0)]
FORK_CASES = [CASES[i] for i in (0, 4, 6, 7)]


@pytest.fixture(scope="module")
def prompts(smol_llm):
    tok = smol_llm.tokenizer
    chats = [tok.apply_chat_template([{"role": "user", "content": c}], tokenize=False,
                                     add_generation_prompt=True) for c in CHATS]
    return [tok.encode(p) for p in chats + PROMPTS[:4]]


def transformers_beams(model, prompt: list[int], k: int, early_stopping, length_penalty,
                       eos: list[int]) -> list[tuple[list[int], float]]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                                                                               dtype=torch.long),
                             num_beams=k, do_sample=False, max_new_tokens=MAX_TOKENS,
                             early_stopping=early_stopping, length_penalty=length_penalty,
                             num_return_sequences=k, eos_token_id=eos, pad_token_id=eos[0],
                             output_scores=True, return_dict_in_generate=True)
    return [(out.sequences[r, len(prompt):].tolist(), float(out.sequences_scores[r]))
            for r in range(k)]


_transformers = {}


@pytest.mark.parametrize("method, k, early_stopping, length_penalty",
                         [("v1", *c) for c in CASES] + [("fork", *c) for c in FORK_CASES])
def test_the_beams_are_transformers_beams(smol_llm, hf_smol, prompts, method, k, early_stopping,
                                          length_penalty):
    eos = sorted(smol_llm.engine.eos_token_ids)
    params = BeamSearchParams(beam_width=k, max_tokens=MAX_TOKENS, early_stopping=early_stopping,
                              length_penalty=length_penalty)
    ours = smol_llm.beam_search(prompts, params, method=method)
    stopped = 0
    for prompt, out in zip(prompts, ours):
        key = (tuple(prompt), k, early_stopping, length_penalty)
        if key not in _transformers:
            _transformers[key] = transformers_beams(hf_smol, prompt, k, early_stopping,
                                                    length_penalty, eos)
        theirs = _transformers[key]
        assert len(out.sequences) == k
        for beam, (tokens, score) in zip(out.sequences, theirs):
            generated = beam.tokens[len(prompt):]
            assert beam.tokens[:len(prompt)] == prompt
            assert tokens[:len(generated)] == generated             # then transformers' pads
            assert set(tokens[len(generated):]) <= {eos[0]}
            assert beam.score == pytest.approx(score, abs=1e-4, rel=1e-5)
            assert beam.finish_reason == ("stop" if generated[-1] in eos else "length")
            stopped += beam.finish_reason == "stop"
        assert [b.score for b in out.sequences] == sorted((b.score for b in out.sequences),
                                                          reverse=True)
    assert stopped > 0                        # EOS was reached: the finished set's rules ran
    stats = smol_llm.engine.stats()
    assert stats.num_running == stats.num_waiting == stats.num_blocks_used == 0


def test_prompt_forms_agree_and_bad_params_are_refused(smol_llm):
    tok = smol_llm.tokenizer
    chat = [{"role": "user", "content": "Name a color."}]
    text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    params = BeamSearchParams(beam_width=2, max_tokens=4)
    outs = smol_llm.beam_search([text, {"prompt": text}, tok.encode(text),
                                 {"prompt_token_ids": tok.encode(text)}, chat], params)
    assert len({tuple(tuple(b.tokens) for b in o.sequences) for o in outs}) == 1
    assert outs[0].sequences[0].text == tok.decode(outs[0].sequences[0].tokens[len(
        tok.encode(text)):], skip_special_tokens=False).removesuffix(tok.eos_token)
    for bad, words in [({"beam_width": 0}, "beam_width"), ({"max_tokens": 1.5}, "max_tokens"),
                       ({"early_stopping": "sometimes"}, "early_stopping"),
                       ({"temperature": 0.7}, "temperature")]:
        with pytest.raises(ValueError, match=words):
            BeamSearchParams(**{"beam_width": 2, "max_tokens": 4, **bad})
    with pytest.raises(ValueError, match="logprobs"):
        smol_llm.beam_search([text], BeamSearchParams(beam_width=11, max_tokens=4))
    with pytest.raises(ValueError, match="max_model_len"):
        smol_llm.beam_search([[1] * 1020], BeamSearchParams(beam_width=2, max_tokens=8))
    with pytest.raises(ValueError, match="method"):
        smol_llm.beam_search([text], params, method="v0")
    sampled = EngineCoreRequest("hot", [1, 2, 3], SamplingParams(temperature=0.7, logprobs=4),
                                beam_search=params)
    with pytest.raises(ValueError, match="V0_SCHEDULER"):        # V1 forks nothing in the core
        smol_llm.engine.engine_core.add_request(sampled)
    with reconfigured(smol_llm, scheduler_cls=V0_SCHEDULER) as llm:
        with pytest.raises(ValueError, match="greedily"):
            llm.engine.engine_core.add_request(sampled)
        assert "hot" not in llm.engine.requests


def held_blocks_agree(engine) -> collections.Counter:
    """Every block's reference count is the number of block tables that hold it, and the
    free list is exactly the blocks none holds; returns the tables' blocks, counted."""
    bm, sched = engine.block_manager, engine.scheduler
    held = collections.Counter(b for r in (*sched.running, *sched.waiting) for b in r.block_table)
    assert [bm.ref_counts[b] for b in range(bm.num_blocks)] == [
        held[b] for b in range(bm.num_blocks)]
    assert set(bm.free_block_ids) == {b for b in range(bm.num_blocks) if not held[b]}
    return held


def test_forked_beams_leak_no_block(smol_llm, prompts):
    """Three beam searches and two plain requests in a pool too small for them all (so beam
    groups are preempted, whole, and searched again, and plain requests swapped out),
    chunked prefill of 32 tokens a step, the prefix cache on, one search aborted half-way:
    after every step each block's references are the tables holding it; at the end every
    block is free, and the two searches that ran to the end found the beams they find alone."""
    params = BeamSearchParams(beam_width=4, max_tokens=12)
    chosen = [prompts[0], prompts[4], prompts[5]]
    alone = smol_llm.beam_search(chosen, params, method="fork")
    with reconfigured(smol_llm, num_kv_blocks=16, max_num_batched_tokens=32,
                      enable_prefix_caching=True, preemption_mode="swap") as llm:  # V0's
        engine, core = llm.engine, llm.engine.engine_core
        beam_sampling = SamplingParams(temperature=0, max_tokens=12, logprobs=8)
        for i, prompt in enumerate(chosen):
            core.add_request(EngineCoreRequest(f"beams-{i}", prompt, beam_sampling,
                                               beam_search=params))
        for i in range(2):
            core.add_request(EngineCoreRequest(f"plain-{i}", prompts[1 + i], SamplingParams(
                temperature=0, max_tokens=20, ignore_eos=True)))
        finished, shared, steps, aborted = collections.defaultdict(list), 0, 0, False
        sched = engine.scheduler                  # V0's (swap mode picks it)
        while core.has_unfinished_requests() and steps < 400:
            outs = core.get_output().outputs
            steps += 1
            for out in outs:        # the hypotheses: "0_beams-i", "1_beams-i", ...
                if "_beams-" in out.request_id:
                    finished[out.request_id.split("_", 1)[1]].append(out)
            shared = max(shared, sum(1 for n in held_blocks_agree(engine).values() if n > 1))
            if steps >= 12 and not aborted and any(  # half-way, while a beam of it runs
                    beam in sched.running for beam in sched.groups["beams-1"].seqs):
                core.abort_requests(["beams-1"])
                aborted = True
        stats = engine.stats()
        assert not core.has_unfinished_requests() and not engine.requests
        assert stats.num_blocks_used == 0 and held_blocks_agree(engine) == {}
        assert stats.num_preemptions > 0 and shared > 0 and aborted
        assert sched.num_swapped_out_blocks > 0 and not sched.groups   # swapped, all gone
        assert engine.block_manager.num_copy_on_write > 0
    for i in (0, 2):
        found = [beam_from_output(chosen[i], out, params.length_penalty).tokens
                 for out in sorted(finished[f"beams-{i}"], key=lambda o: o.request_id)]
        assert found == [b.tokens for b in alone[i].sequences]
