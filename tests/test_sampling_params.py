"""SamplingParams alone (no model): every value a JSON request can carry is either accepted as
a clean value or refused with an error that names the field (issue 13, part 0)."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm import SamplingParams
from minivllm.sampling_params import MAX_LOGPROBS


@pytest.mark.parametrize("kwargs, error, message", [
    ({"temperature": "1"}, TypeError, "temperature must be a number, got '1' (str)"),
    ({"top_p": None}, TypeError, "top_p must be a number, got None"),
    ({"max_tokens": True}, TypeError, "max_tokens must be an integer, got True (bool)"),
    ({"max_tokens": 2.0}, TypeError, "max_tokens must be an integer, got 2.0 (float)"),
    ({"n": False}, TypeError, "n must be an integer, got False (bool)"),
    ({"temperature": math.nan}, ValueError, "temperature must be a finite number, got nan"),
    ({"top_p": math.inf}, ValueError, "top_p must be a finite number, got inf"),
    ({"logprobs": 10**6}, ValueError, f"<= {MAX_LOGPROBS} (max_logprobs), got 1000000"),
    ({"logprobs": True}, TypeError, "logprobs must be an integer, got True"),
    ({"seed": "7"}, TypeError, "seed must be an integer, got '7' (str)"),
    ({"stop": [3]}, TypeError, "stop must be a string or a list of strings, got an item 3"),
    ({"stop": 3}, TypeError, "stop must be a string or a list of strings, got 3"),
    ({"stop_token_ids": [-1]}, ValueError, "stop_token_ids must be token ids >= 0, got -1"),
    ({"stop_token_ids": [1.5]}, TypeError, "stop_token_ids must be an integer, got 1.5"),
    ({"ignore_eos": 1}, TypeError, "ignore_eos must be true or false, got 1 (int)"),
])
def test_wrong_types_and_values_name_the_field(kwargs, error, message):
    with pytest.raises(error) as e:
        SamplingParams(**kwargs)
    assert message in str(e.value)


def test_numbers_are_normalized():
    p = SamplingParams(temperature=1, top_p=1, logprobs=MAX_LOGPROBS, stop="###")
    assert type(p.temperature) is float and type(p.top_p) is float
    assert p.logprobs == MAX_LOGPROBS and p.stop == ["###"]


# Anything JSON can carry, plus the floats JSON cannot (NaN, inf) that Python callers can.
anything = st.one_of(st.none(), st.booleans(), st.integers(-10**7, 10**7),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3),
                     st.lists(st.integers(-3, 5), max_size=2), st.lists(st.text(max_size=2),
                                                                        max_size=2))
FIELDS = ["n", "temperature", "top_p", "top_k", "max_tokens", "stop", "stop_token_ids", "seed",
          "logprobs", "ignore_eos"]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELDS), anything, max_size=4))
def test_any_value_is_accepted_clean_or_refused_by_name(kwargs):
    try:
        p = SamplingParams(**kwargs)
    except (TypeError, ValueError) as e:
        # The message opens with the name of a field this request set.
        assert any(str(e).startswith(f) for f in kwargs), (kwargs, str(e))
        return
    # Accepted: every value is one the sampler can use.
    assert math.isfinite(p.temperature) and p.temperature >= 0
    assert math.isfinite(p.top_p) and 0 < p.top_p <= 1
    for name in ("n", "max_tokens", "top_k"):
        assert type(getattr(p, name)) is int
    assert p.n >= 1 and p.max_tokens >= 1 and p.top_k >= -1
    assert p.logprobs is None or (type(p.logprobs) is int and 0 <= p.logprobs <= MAX_LOGPROBS)
    assert p.seed is None or type(p.seed) is int
    assert all(isinstance(s, str) and s for s in p.stop)
    assert all(type(t) is int and t >= 0 for t in p.stop_token_ids)
    assert type(p.ignore_eos) is bool
