"""The sampler sorts the vocabulary only for rows that ask for top-k / top-p, and a seeded
request draws the same tokens as when every row was sorted."""

import pytest
import torch

import minivllm.sample.sampler as sampler
from conftest import PROMPTS
from minivllm import SamplingParams


def _sorting_every_row(logits, params):
    """sampling_probs as it was: every row through apply_top_k_top_p."""
    vocab = logits.shape[-1]
    temp = torch.tensor([p.temperature for p in params])
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params])
    top_p = torch.tensor([p.top_p for p in params])
    return sampler.apply_top_k_top_p(logits / temp[:, None], top_k, top_p).softmax(dim=-1)


@pytest.fixture
def sorted_rows(monkeypatch):
    """Counts the rows that go through the sort."""
    rows, sort = [], sampler.apply_top_k_top_p

    def counting(logits, top_k, top_p):
        rows.append(logits.shape[0])
        return sort(logits, top_k, top_p)
    monkeypatch.setattr(sampler, "apply_top_k_top_p", counting)
    return rows


def test_only_rows_with_top_k_or_top_p_are_sorted(sorted_rows):
    torch.manual_seed(0)
    logits = torch.randn(4, 1000)
    params = [SamplingParams(temperature=0.7), SamplingParams(temperature=1.0, top_k=5),
              SamplingParams(temperature=0.5), SamplingParams(temperature=1.0, top_p=0.9)]
    probs = sampler.sampling_probs(logits, params)
    assert sorted_rows == [2]
    assert (probs[1] > 0).sum() == 5 and (probs[0] > 0).sum() == 1000
    torch.testing.assert_close(probs, _sorting_every_row(logits, params), atol=1e-7, rtol=0)
    sorted_rows.clear()
    sampler.sampling_probs(logits[[0, 2]], [params[0], params[2]])
    assert sorted_rows == []                       # nobody asked: no sort at all


@pytest.mark.parametrize("extra", [{}, {"top_k": 40, "top_p": 0.9}])
def test_seeded_requests_draw_the_same_tokens_as_with_every_row_sorted(smol, monkeypatch,
                                                                      extra):
    llm = smol()
    params = [SamplingParams(max_tokens=10, temperature=0.9, seed=i, **extra)
              for i in range(len(PROMPTS))]

    def tokens():
        return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]

    fast = tokens()
    monkeypatch.setattr(sampler, "sampling_probs", _sorting_every_row)
    assert tokens() == fast
    assert len({tuple(t) for t in fast}) == len(PROMPTS)
