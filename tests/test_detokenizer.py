"""Incremental detokenization: the streamed text must equal decoding every token at once, while
each step decodes only a few tokens. On the packaged model's tokenizer (byte-level BPE)."""

import random

import pytest

from minivllm import SamplingParams
from minivllm.engine.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from minivllm.models.loader import load_tokenizer

TEXTS = [
    "Paged attention keeps the KV cache in blocks of 16 tokens.",
    "Emoji split into bytes: 🚀🧠 and accents: café, naïve, Ångström.",
    "中文分词测试：每个汉字可能占用多个字节。日本語もです。",
    "  leading spaces,\ttabs\nand new\n\nlines  ",
    "<|im_start|>assistant\nspecial tokens inside<|im_end|> the text",
]


@pytest.fixture(scope="module")
def tokenizer(smol_path):
    return load_tokenizer(smol_path)


class CountingTokenizer:
    """Wraps a tokenizer and records how many tokens each decode call was given."""

    def __init__(self, tokenizer):
        self.tokenizer, self.lengths = tokenizer, []

    def decode(self, ids, **kwargs):
        self.lengths.append(len(ids))
        return self.tokenizer.decode(ids, **kwargs)


def stream(tokenizer, ids, skip_special_tokens=True, start=0):
    """Feed ids one token at a time; return the pieces emitted (the last call is final)."""
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens, start=start)
    pieces = [detok.update(ids[:i], final=i == len(ids)) for i in range(start + 1, len(ids) + 1)]
    assert "".join(pieces) == detok.text
    return pieces, detok.text


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("text", TEXTS)
def test_streamed_text_equals_full_decode(tokenizer, text, skip):
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces, streamed = stream(tokenizer, ids, skip)
    assert streamed == tokenizer.decode(ids, skip_special_tokens=skip)
    # Valid text never shows a half character: every prefix emitted is a prefix of the result.
    assert REPLACEMENT_CHAR not in streamed
    so_far = ""
    for piece in pieces:
        so_far += piece
        assert streamed.startswith(so_far)


def test_multibyte_character_waits_until_whole(tokenizer):
    ids = tokenizer.encode("🚀", add_special_tokens=False)
    assert len(ids) > 1, "the rocket should take several byte tokens"
    pieces, streamed = stream(tokenizer, ids)
    assert pieces[:-1] == [""] * (len(ids) - 1) and pieces[-1] == "🚀" == streamed


def test_random_tokens_match_full_decode(tokenizer):
    """Random ids, invalid byte sequences and special tokens included, with and without
    skipping: the final text is exactly the one-shot decode."""
    rng = random.Random(0)
    vocab = len(tokenizer)
    for trial in range(40):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        if trial % 3 == 0:                          # mix in byte-level pieces of emoji
            pieces = tokenizer.encode("🧠é中", add_special_tokens=False)[1:]
            ids[rng.randrange(len(ids)):0] = pieces
        for skip in (True, False):
            _, streamed = stream(tokenizer, ids, skip)
            assert streamed == tokenizer.decode(ids, skip_special_tokens=skip), (ids, skip)


def test_only_output_tokens_are_detokenized(tokenizer):
    prompt = tokenizer.encode("The prompt is not part of the output.", add_special_tokens=False)
    out = tokenizer.encode(" The answer is 42.", add_special_tokens=False)
    _, streamed = stream(tokenizer, prompt + out, start=len(prompt))
    assert streamed == tokenizer.decode(out, skip_special_tokens=True)


def test_each_step_decodes_a_short_window(tokenizer):
    """The point of it all: per-step work does not grow with the length of the output."""
    ids = tokenizer.encode(" ".join(TEXTS) * 4, add_special_tokens=False)
    assert len(ids) > 300
    counting = CountingTokenizer(tokenizer)
    _, streamed = stream(counting, ids)
    assert streamed == tokenizer.decode(ids, skip_special_tokens=True)
    assert max(counting.lengths) <= 12, max(counting.lengths)


def test_engine_streams_consistent_text(smol_llm):
    """Through the engine: each step's text extends the previous one and the final text is
    the decode of the final tokens."""
    engine = smol_llm.engine
    engine.add_request("stream", "Write a short poem about the sea.",
                       SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    texts = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            texts.append(out.outputs[0].text)
            final = out
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    completion = final.outputs[0]
    assert len(completion.token_ids) == 40
    assert completion.text == smol_llm.tokenizer.decode(completion.token_ids,
                                                        skip_special_tokens=True)


def test_stop_string_across_token_boundaries(smol_llm):
    """A stop string that spans several tokens is found when its last piece arrives, and the
    text is cut before it (or after it, with include_stop_str_in_output)."""
    prompt, tok = "Count slowly: one, two, three,", smol_llm.tokenizer
    greedy = smol_llm.generate([prompt], SamplingParams(temperature=0, max_tokens=24),
                               use_tqdm=False)[0].outputs[0]
    ids, full = greedy.token_ids, greedy.text
    boundary = len(tok.decode(ids[:6], skip_special_tokens=True))   # end of the 6th token
    stop = full[boundary - 3:boundary + 4]                          # straddles it
    assert len(stop) == 7 and full.find(stop) == boundary - 3, (full, stop)
    for keep in (False, True):
        out = smol_llm.generate([prompt], SamplingParams(
            temperature=0, max_tokens=24, stop=[stop], include_stop_str_in_output=keep),
            use_tqdm=False)[0].outputs[0]
        assert out.finish_reason == "stop"
        assert out.text == full[:boundary - 3 + (len(stop) if keep else 0)]
        assert out.token_ids == ids[:len(out.token_ids)] and len(out.token_ids) < len(ids)
