"""Beam search (minivllm/beam_search.py, vLLM V1's way: one-token requests with logprobs over the
public API) against transformers' `generate(num_beams=k, do_sample=False)` on the same weights
in fp32: the same k sequences, in the same order, with the same scores.

Eight prompts (four chat turns, whose answers end in EOS within the budget, and four plain
continuations), beam widths 2 and 4, early_stopping True, False and "never", and length
penalties 0, 1 and 2. No ties were met on these prompts; a near-tie in the fp32 sums (1e-6) is
the one way the two could disagree and still both be right.
"""

import pytest
import torch

from minivllm import BeamSearchParams

from conftest import PROMPTS

MAX_TOKENS = 16
CHATS = ["What is 2+2?", "Name a color.", "Say hi.", "Is the sky blue? Answer yes or no."]
CASES = [(2, True, 1.0), (2, False, 1.0), (2, "never", 1.0), (4, True, 1.0), (4, False, 1.0),
         (4, "never", 1.0), (4, "never", 2.0), (2, False, 0.0)]


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


@pytest.mark.parametrize("k, early_stopping, length_penalty", CASES)
def test_the_beams_are_transformers_beams(smol_llm, hf_smol, prompts, k, early_stopping,
                                          length_penalty):
    eos = sorted(smol_llm.engine.eos_token_ids)
    params = BeamSearchParams(beam_width=k, max_tokens=MAX_TOKENS, early_stopping=early_stopping,
                              length_penalty=length_penalty)
    ours = smol_llm.beam_search(prompts, params)
    stopped = 0
    for prompt, out in zip(prompts, ours):
        theirs = transformers_beams(hf_smol, prompt, k, early_stopping, length_penalty, eos)
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
