"""Logits processors (penalties, min_tokens) and guided decoding (xgrammar), on real models.

The structured-output checks sample at temperature 1 from the packaged SmolLM2-135M and judge
the outputs with libraries we did not write: json.loads, jsonschema, re.fullmatch. The
penalties are checked against a direct computation with transformers' own tiny model.
"""

import json
import re

import jsonschema
import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.sample.logits_processor import apply_grammar_bitmask, apply_penalties
from minivllm.sampling_params import GuidedDecodingParams

from conftest import nested_schema, reconfigured, rss_mb

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
REVIEW = {"type": "object", "additionalProperties": False,
          "required": ["sentiment", "stars", "spam"],
          "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]},
                         "stars": {"type": "integer", "minimum": 1, "maximum": 5},
                         "spam": {"type": "boolean"}}}
N = 50


def chat(llm, text: str) -> str:
    return llm.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                             tokenize=False, add_generation_prompt=True)


def parses(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def test_json_schemas_hold_for_50_samples_each_and_unconstrained_fails(smol):
    """One batched generate: 50 samples per schema (temperature 1), plus 20 of the person
    request unconstrained. Every constrained sample parses and validates and ends with EOS; the
    unconstrained ones often do not (the measured rate is printed)."""
    llm = smol(max_num_seqs=2 * N + 20, max_model_len=512)
    compiled_before = llm.engine.structured_output.num_compiled   # the cache outlives reconfigure
    person = chat(llm, "Describe a person as a JSON object with keys name and age.")
    review = chat(llm, "Classify this review as JSON: 'Great phone, battery lasts two days.'")
    guided = lambda schema, ws: SamplingParams(  # noqa: E731
        n=N, temperature=1.0, max_tokens=48, seed=1,     # room for odd tokenizations
        guided_decoding=GuidedDecodingParams(json=schema, disable_any_whitespace=ws))
    outs = llm.generate([person, review, person],
                        [guided(PERSON, False), guided(REVIEW, True),
                         SamplingParams(n=20, temperature=1.0, max_tokens=24, seed=1)],
                        use_tqdm=False)
    for out, schema in zip(outs[:2], (PERSON, REVIEW)):
        assert len(out.outputs) == N
        bad = [c.text for c in out.outputs if not parses(c.text, schema)]
        assert not bad, f"{len(bad)} of {N} break the schema, e.g. {bad[0]!r}"
        assert {c.finish_reason for c in out.outputs} == {"stop"}
    assert not any("\n" in c.text for c in outs[1].outputs)    # no free whitespace
    failures = sum(not parses(c.text, PERSON) for c in outs[2].outputs)
    print(f"unconstrained: {failures}/20 fail to parse and validate")
    assert failures >= 5                       # the constraint, not the prompt, does the work
    so = llm.engine.structured_output
    assert so.num_compiled - compiled_before == 2   # once per schema, not once per sample
    masked = llm.engine.core.structured_output.num_masked_rows      # filled by the core
    assert masked >= 2 * N * 5 and not llm.engine.requests           # matchers went too
    assert llm.engine.stats().num_blocks_used == 0


def test_choice_and_regex_always_hold(smol):
    llm = smol(max_num_seqs=32, max_model_len=256)
    choices = ["red", "green", "blue", "dark purple"]
    regex = r"\d{3}-\d{4}( ext\. \d{1,3})?"
    params = lambda g: SamplingParams(n=16, temperature=1.0, max_tokens=16,  # noqa: E731
                                      seed=2, guided_decoding=g)
    outs = llm.generate([chat(llm, "Pick a colour."), chat(llm, "A phone number, please.")],
                        [params(GuidedDecodingParams(choice=choices)),
                         params(GuidedDecodingParams(regex=regex))], use_tqdm=False)
    picked = [c.text for c in outs[0].outputs]
    assert set(picked) <= set(choices) and len(set(picked)) >= 2     # sampled, and in the set
    numbers = [c.text for c in outs[1].outputs]
    assert all(re.fullmatch(regex, t) for t in numbers), numbers
    assert llm.engine.stats().num_blocks_used == 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_keeps_the_constraint(smol, mode):
    """A pool too small for 6 samples: sequences are preempted mid-JSON and resume with their
    matcher where they left it."""
    llm = smol(max_num_seqs=6, max_model_len=256, block_size=8, num_kv_blocks=12,
               preemption_mode=mode, swap_space=1 / 16, enable_prefix_caching=False)
    params = SamplingParams(n=6, temperature=1.0, max_tokens=24, seed=3, guided_decoding=(
        GuidedDecodingParams(json=PERSON, disable_any_whitespace=True)))
    with llm.engine.trace() as steps:
        (out,) = llm.generate(chat(llm, "A person as JSON."), params, use_tqdm=False)
    assert sum(len(s.preempted) for s in steps) > 0, "nothing was preempted"
    assert all(parses(c.text, PERSON) for c in out.outputs), [c.text for c in out.outputs]
    assert llm.engine.stats().num_blocks_used == 0 and not llm.engine.requests


def test_chunked_prefill_and_prefix_caching_leave_guided_tokens_alone(smol):
    """Seeded guided samples are the same tokens whether the prompt is prefilled whole or in
    16-token chunks, and whether it is computed or found in the prefix cache."""
    params = SamplingParams(n=2, temperature=1.0, max_tokens=32, seed=4, guided_decoding=(
        GuidedDecodingParams(json=PERSON, disable_any_whitespace=True)))
    run = lambda: llm.generate(prompt, params, use_tqdm=False)[0].outputs  # noqa: E731
    llm = smol(max_num_seqs=2, max_model_len=256, enable_prefix_caching=False)
    prompt = chat(llm, "A person as JSON.")
    whole = run()
    llm = smol(max_num_seqs=2, max_model_len=256, max_num_batched_tokens=16)
    with llm.engine.trace() as steps:
        chunked, cached = run(), run()
    assert sum(x.is_prefill for s in steps for x in s.scheduled) > 3     # prefilled in chunks
    assert llm.engine.stats().prefix_cache_hit_tokens >= 16              # and found cached
    assert ([c.token_ids for c in whole] == [c.token_ids for c in chunked]
            == [c.token_ids for c in cached])
    assert all(parses(c.text, PERSON) for c in whole)


def test_greedy_unchanged_by_the_seam(smol):
    """Plain greedy requests give the same tokens alone and batched with rows that the
    processors edit (penalties, min_tokens, a grammar): the seam touches only those rows."""
    llm = smol(max_model_len=256)
    prompts = ["The capital of France is", "def fibonacci(n):\n    "]
    greedy = SamplingParams(temperature=0, max_tokens=12)
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
    busy = [SamplingParams(temperature=0, max_tokens=12, repetition_penalty=1.3,
                           frequency_penalty=0.5, min_tokens=5),
            SamplingParams(temperature=0.8, max_tokens=12, seed=0, presence_penalty=1.0,
                           guided_decoding=GuidedDecodingParams(json_object=True))]
    mixed = llm.generate(prompts + prompts, [greedy, greedy] + busy, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed[:2]] == alone
    assert mixed[2].outputs[0].token_ids != alone[0]        # the penalties did act


def _penalized(logits, prompt, output, p):
    """The penalties written out token by token, as vLLM documents them."""
    x = logits.clone()
    for t in set(prompt) | set(output):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(output):
        x[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    return x


def test_batched_penalties_match_the_direct_formula():
    class Seq:                                   # the two fields apply_penalties reads
        def __init__(self, prompt, output, params):
            self.prompt_token_ids = prompt
            self.output_token_ids = output
            self.sampling_params = params
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=g) * 3
    seqs = [Seq([1, 2, 3], [4, 4, 5], SamplingParams(repetition_penalty=1.5)),
            Seq([7], [], SamplingParams()),
            Seq([1, 9], [9, 9, 9, 2], SamplingParams(frequency_penalty=0.7,
                                                     presence_penalty=-0.4)),
            Seq([3, 3], [8, 3], SamplingParams(repetition_penalty=0.8, presence_penalty=2.0,
                                               frequency_penalty=-1.0))]
    got = logits.clone()
    apply_penalties(got, seqs)
    for i, s in enumerate(seqs):
        want = _penalized(logits[i], s.prompt_token_ids, s.output_token_ids, s.sampling_params)
        torch.testing.assert_close(got[i], want)
    assert torch.equal(got[1], logits[1])


def test_the_workers_bitmask_matches_xgrammars_own_apply():
    """The worker turns the core's bitmask into -inf with torch alone (no xgrammar on its
    side): the same rows as xgrammar's apply_token_bitmask_inplace, random bits over a
    vocabulary that is not a multiple of 32, and rows without a mask untouched."""
    import xgrammar as xgr

    class Seq:                                   # the one field apply_grammar_bitmask reads
        def __init__(self, bitmask):
            self.grammar_bitmask = bitmask
    vocab = 100
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, vocab, generator=g)
    bitmask = torch.randint(-2**31, 2**31 - 1, (2, 4), generator=g, dtype=torch.int64).int()
    got = logits.clone()
    apply_grammar_bitmask(got, [Seq(bitmask[0]), Seq(None), Seq(bitmask[1])])
    want = logits.clone()
    xgr.apply_token_bitmask_inplace(want, bitmask[[0, 0, 1]], vocab_size=vocab, indices=[0, 2])
    assert torch.equal(got, want) and torch.equal(got[1], logits[1])
    assert 0 < int(got.isinf().sum()) < 2 * vocab


def test_a_request_whose_tokens_break_its_grammar_fails_alone(smol_llm):
    """The core's matcher catches up with a request's tokens before it fills the request's
    row of the step's bitmask. Tokens its grammar refuses (after the grammar has ended, under
    ignore_eos, say) fail that request with the step, its row left open; the core and the
    other rows go on."""
    from minivllm.core.request import Request
    from minivllm.core.scheduler_output import SchedulerOutput
    manager = smol_llm.engine.core.structured_output        # the core's: matchers, bitmasks
    choice = GuidedDecodingParams(choice=["yes", "no"])
    requests = {}
    for req_id, answer in (("bad", " maybe"), ("good", "")):
        request = Request(req_id, [1, 2, 3], SamplingParams(guided_decoding=choice))
        request.grammar = smol_llm.engine.structured_output.compile(choice)
        request.token_ids += smol_llm.tokenizer.encode(answer)
        requests[req_id] = request
    so = SchedulerOutput(req_ids=["bad", "good"], sampling=[True, True])
    manager.grammar_bitmask(so, requests)
    assert so.structured_output_request_ids == ["bad", "good"]
    assert list(so.grammar_errors) == ["bad"] and "breaks the choice" in so.grammar_errors["bad"]
    assert bool((so.grammar_bitmask[0] == -1).all())                # open: every token allowed
    allowed = int(((so.grammar_bitmask[1][:, None] >> torch.arange(32)) & 1).sum())
    assert 0 < allowed < 10                                         # "yes" or "no" only
    assert requests["good"].matcher is not None                     # kept on the Request


def test_penalties_and_min_tokens_on_a_tiny_model(tiny_checkpoint):
    """Greedy with penalties equals argmax of the directly penalized logits of transformers'
    model, step by step; min_tokens holds a stop token back until it has enough tokens."""
    path, hf = tiny_checkpoint("llama")
    llm = LLM(str(path), max_model_len=128)
    prompt = [5, 17, 300, 42, 9]
    with torch.no_grad():               # grow the prompt until its greedy next token is in it
        for _ in range(30):
            first = int(hf(torch.tensor([prompt])).logits[0, -1].argmax())
            if first in prompt:
                break
            prompt = [first] + prompt
    assert first in prompt
    p = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, repetition_penalty=8.0,
                       frequency_penalty=0.5, presence_penalty=0.3)
    got = llm.generate(prompt, p, use_tqdm=False)[0].outputs[0].token_ids
    output = []
    with torch.no_grad():
        for _ in range(10):
            logits = hf(torch.tensor([prompt + output])).logits[0, -1]
            output.append(int(_penalized(logits, prompt, output, p).argmax()))
    assert got == output
    plain = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
                         use_tqdm=False)[0].outputs[0].token_ids
    assert plain[0] == first != got[0]                      # the penalties changed something
    stop = plain[0]
    short = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=10,
                                                stop_token_ids=[stop]), use_tqdm=False)
    held = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=10, min_tokens=4,
                                               stop_token_ids=[stop]), use_tqdm=False)
    assert short[0].outputs[0].token_ids == [stop]
    tokens = held[0].outputs[0].token_ids
    assert len(tokens) >= 4 and stop not in tokens[:4]


def test_bad_constraints_and_combinations_are_refused(smol):
    llm = smol(max_model_len=256)
    with pytest.raises(ValueError, match="exactly one of"):
        GuidedDecodingParams(json={"type": "object"}, regex="a+")
    with pytest.raises(ValueError, match="choice must be a non-empty list"):
        GuidedDecodingParams(choice=[])
    with pytest.raises(ValueError, match="repetition_penalty must be > 0"):
        SamplingParams(repetition_penalty=0)
    with pytest.raises(ValueError, match="min_tokens must be in"):
        SamplingParams(min_tokens=20, max_tokens=10)
    for g, reason in [(GuidedDecodingParams(json={"type": "objec"}), "invalid JSON schema"),
                      (GuidedDecodingParams(json="{not json"), "invalid JSON schema"),
                      (GuidedDecodingParams(regex="(ab"), "invalid regex")]:
        with pytest.raises(ValueError, match=reason):
            llm.engine.add_request("bad", "Hi", SamplingParams(guided_decoding=g))
    assert not llm.engine.requests
    llm = smol(max_model_len=256, speculative_config={"method": "ngram",
                                                       "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="not supported with speculative decoding"):
        llm.engine.add_request("spec", "Hi", SamplingParams(
            guided_decoding=GuidedDecodingParams(choice=["a", "b"])))


def test_a_compile_over_its_limits_is_refused_and_the_server_stays_small(smol_llm):
    """The server's compiles run in a child process (GrammarSandbox): one over its CPU time or
    its memory is a ValueError naming the limit and its flag, the child is replaced, and this
    process does not grow (two thousand required properties once grew a server to 22 GB)."""
    manager = smol_llm.engine.structured_output
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2000)},
            "required": [f"p{i}" for i in range(2000)]}
    sandbox = manager.sandbox(timeout_s=1.0, memory_mb=512)
    before = rss_mb()
    try:
        with pytest.raises(ValueError, match=r"over 1 s of CPU.*-compile-seconds"):
            manager.compile(GuidedDecodingParams(json=nested_schema(300)), (1.0, 512))
        sandbox.timeout_s = 120.0              # the same child: now memory is what binds
        with pytest.raises(ValueError, match=r"512 MiB.*-compile-memory-mb"):
            manager.compile(GuidedDecodingParams(json=wide), (1.0, 512))
        with pytest.raises(ValueError, match="invalid regex"):      # the child's own answer
            manager.compile(GuidedDecodingParams(regex="(ab"), (1.0, 512))
        assert sandbox.num_killed >= 1
        grammar = manager.compile(GuidedDecodingParams(regex="[ab]{3}"), (1.0, 512))
        assert type(grammar).__name__ == "CompiledGrammar"
    finally:
        sandbox.close()
    assert rss_mb() - before < 100, f"this process grew {rss_mb() - before:.0f} MB"


def test_bench_guided_report(smol, capsys):
    """`minivllm bench guided`'s two parts on the session's model: compile times (a cache
    hit after the first compile) and a guided run whose every step had its mask applied."""
    from minivllm.benchmarks import guided as bench_guided
    llm = smol(max_num_seqs=4, max_model_len=256)
    bench_guided.bench_compile(llm.tokenizer, llm.engine.model_config.hf_config.vocab_size,
                               llm.engine.eos_token_ids)
    rows = re.findall(r"^(.+?)\s+([\d.]+)\s+([\d.]+)$", capsys.readouterr().out, re.MULTILINE)
    assert [r[0].strip() for r in rows] == list(bench_guided.CONSTRAINTS)
    assert all(float(r[2]) < float(r[1]) or float(r[1]) < 1 for r in rows)   # cached: faster
    prompt = chat(llm, "A person as JSON.")
    run = bench_guided.serve_once(llm, prompt, 2, 6, GuidedDecodingParams(json=PERSON))
    assert run["steps"] >= 2 and run["mask_ms"] > 0 and run["rows"] >= run["steps"]
    assert bench_guided.serve_once(llm, prompt, 2, 6, None)["rows"] == 0


# ---------------------------------------------------------------- the server (last: it takes
# the session's engine over for the rest of the module)
@pytest.fixture(scope="module")
def client(smol_llm):
    import openai

    from minivllm.engine.async_llm_engine import AsyncLLMEngine
    from minivllm.entrypoints.openai.api_server import Server, bind_socket
    with reconfigured(smol_llm, max_model_len=256, max_num_seqs=16) as llm:
        server = Server(AsyncLLMEngine(llm.engine), bind_socket("127.0.0.1", 0), "smol",
                        graceful_s=1.0).start()
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0,
                            default_headers={"Connection": "close"},
                            timeout=120)
        server.stop()


def test_server_response_format_and_guided_extras(client):
    messages = [{"role": "user", "content": "Describe a person as a JSON object with keys name "
                                            "and age."}]
    schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    r = client.chat.completions.create(model="smol", messages=messages, n=4, temperature=1.0,
                                       max_tokens=48, seed=1, response_format=schema)
    assert all(parses(c.message.content, PERSON) for c in r.choices), [
        (c.message.content, c.finish_reason) for c in r.choices]
    r = client.chat.completions.create(model="smol", messages=messages, max_tokens=40,
                                       temperature=0, response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = client.completions.create(model="smol", prompt="The sky is", max_tokens=8, n=4,
                                  temperature=1.0, extra_body={"guided_choice": ["blue", "grey"]})
    assert {c.text for c in r.choices} <= {"blue", "grey"}
    r = client.completions.create(model="smol", prompt="Year:", max_tokens=8, temperature=1.0,
                                  extra_body={"guided_regex": r"(19|20)\d\d", "min_tokens": 2})
    assert re.fullmatch(r"(19|20)\d\d", r.choices[0].text)


@pytest.mark.parametrize("body, reason", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "objec"}}}}, "invalid JSON schema"),
    ({"response_format": {"type": "json_schema"}}, "needs a \"json_schema\""),
    ({"guided_regex": "(ab"}, "invalid regex"),
    # Constraints that compile but admit no token (issue 43: these were a 200, finish "abort").
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"$ref": "#"}}}}, "JSON schema admits no output"),
    ({"guided_json": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                      "$ref": "#/$defs/a"}}, "JSON schema admits no output"),
    ({"guided_grammar": "root ::= a\na ::= root"}, "grammar admits no output"),
    ({"guided_regex": "[^\\s\\S]"}, "regex admits no output"),
    ({"guided_regex": "a+", "guided_choice": ["a"]}, "give one constraint"),
    ({"presence_penalty": 3.0}, "presence_penalty must be in [-2, 2]"),
])
def test_server_refuses_bad_constraints_with_400(client, body, reason):
    import openai
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", max_tokens=4, extra_body=body,
                                       messages=[{"role": "user", "content": "Hi"}])
    assert e.value.status_code == 400 and reason in e.value.message


def test_a_constraint_that_admits_nothing_is_a_400_before_any_byte_streamed(client):
    """Streaming too: the refusal comes as the response's status, not inside a 200 stream."""
    import openai
    with pytest.raises(openai.BadRequestError, match="admits no output"):
        client.completions.create(model="smol", prompt="Hi", max_tokens=4, stream=True,
                                  extra_body={"guided_json": {"$ref": "#"}})
