"""Beam search as vLLM V1 runs it: outside the engine, over its public API (vLLM twin:
vllm/beam_search.py, and LLM.beam_search in vllm/entrypoints/llm.py).

    outs = llm.beam_search(["The capital of France is"], BeamSearchParams(beam_width=4,
                                                                         max_tokens=16))
    outs[0].sequences[0].text, .tokens, .cum_logprob, .score        # best first

Every step, each running beam of every prompt goes to the engine as a request for one token
with `logprobs` = the number of candidates: the beam's whole history is its prompt, and what
the beams share (the prompt, the tokens a parent gave its children) comes back from the prefix
cache, block by block; nothing in the engine knows the requests are beams. V0's design, which
forks one request's block tables inside the engine core, sharing blocks copy-on-write, is the
other way (core/v0/beam_group.py; `LLM.beam_search(..., method="fork")`): the same beams,
from the same rules (BeamSearchInstance below), each token computed once (lesson 02).

Which beams survive follows transformers' `generate(num_beams=k, do_sample=False)` (its
`_beam_search`, transformers 5), token for token (tests/test_beam_search.py):

- candidates: the best (1 + EOS ids, at least 2) x k continuations over all running beams, by
  cumulative logprob (log_softmax of the fp32 logits, summed over the generated tokens);
- running: the best k candidates that neither end in EOS nor reach max_tokens;
- finished: a candidate that ends in EOS or reaches max_tokens joins the finished set only if
  it ranks among the best k candidates, scored cum_logprob / generated_len ** length_penalty
  (the generated length counting its last token, EOS too); the set keeps the best k;
- stopping: early_stopping=True stops once k are finished; False stops once the best running
  beam, scored at its current length, cannot beat the worst of k finished; "never" scores it
  at max_tokens when length_penalty > 0, the best length it could reach.

vLLM's own beam_search differs: it takes 2k candidates per beam, keeps every one that ends in
EOS whatever its rank, has no early stop (it runs max_tokens steps), and its length penalty
(get_beam_search_score) divides by the length of prompt and output together, EOS not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tqdm.auto import tqdm

from minivllm.sampling_params import MAX_LOGPROBS, SamplingParams


def num_candidates(beam_width: int, eos_ids: set[int]) -> int:
    """Continuations kept each step, as transformers: enough that k survive however many end
    in one of the EOS ids; also the logprobs each beam's request asks for."""
    return max(2, 1 + len(eos_ids)) * beam_width


@dataclass
class BeamSearchParams:
    """vLLM's BeamSearchParams (vllm/sampling_params.py), with transformers' early_stopping."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0            # vLLM's field; beam search here is deterministic: 0
    length_penalty: float = 1.0
    early_stopping: bool | str = False

    def __post_init__(self):
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            raise ValueError(f"early_stopping must be True, False or 'never', "
                             f"got {self.early_stopping!r}")
        if self.temperature != 0:
            raise ValueError(f"temperature must be 0 for beam search, got {self.temperature}")


@dataclass
class BeamSearchSequence:
    """One beam: the prompt's tokens and the generated ones (vLLM's shape)."""

    tokens: list[int]
    logprobs: list[dict[int, float]] = field(default_factory=list)   # each generated token's
    cum_logprob: float = 0.0
    score: float = 0.0                  # cum_logprob / generated_len ** length_penalty
    text: str = ""
    finish_reason: str | None = None    # "stop" (EOS) or "length"


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]     # the beam_width best, best first


@dataclass
class BeamSearchInstance:
    """One prompt's search: its running beams (best first) and its finished ones."""

    prompt_len: int
    running: list[BeamSearchSequence]
    finished: list[BeamSearchSequence] = field(default_factory=list)
    improvable: bool = True             # transformers' early-stop heuristic not yet met
    done: bool = False

    def advance(self, logprobs: list[dict[int, float]], params: BeamSearchParams,
                eos_ids: set[int]) -> list[int]:
        """One step: `logprobs[i]` holds running beam i's top continuations. Returns, for each
        new running beam, the index of the old one it extends (the fork design forks it)."""
        k, lp = params.beam_width, params.length_penalty
        candidates = sorted(((beam.cum_logprob + logprob, i, token, logprob)
                             for i, beam in enumerate(self.running)
                             for token, logprob in logprobs[i].items()),
                            key=lambda c: -c[0])[:num_candidates(k, eos_ids)]
        generated = len(self.running[0].tokens) - self.prompt_len + 1
        reasons = [("stop" if token in eos_ids and not params.ignore_eos else
                    "length" if generated >= params.max_tokens else None)
                   for _, _, token, _ in candidates]  # None: the candidate runs on
        survivors = [c for c, why in zip(candidates, reasons) if why is None][:k]
        running = [self.extend(c) for c in survivors]
        full = len(self.finished) == k
        if self.improvable and not (full and params.early_stopping is True):
            self.finished += [self.extend(c, generated ** lp, why)       # from the top k only
                              for c, why in zip(candidates[:k], reasons) if why is not None]
            self.finished = sorted(self.finished, key=lambda b: -b.score)[:k]
        if len(self.finished) == k:
            length = (params.max_tokens if params.early_stopping == "never" and lp > 0
                      else generated)
            best = running[0].cum_logprob if running else -1e9
            self.improvable &= best / length ** lp > self.finished[-1].score
        self.running = running
        self.done = (not self.improvable or not running
                     or (len(self.finished) == k and params.early_stopping is True))
        return [i for _, i, _, _ in survivors]

    def extend(self, candidate, divisor: float = 1.0, reason: str | None = None):
        cum_logprob, i, token, logprob = candidate
        beam = self.running[i]
        return BeamSearchSequence(beam.tokens + [token], beam.logprobs + [{token: logprob}],
                                  cum_logprob, cum_logprob / divisor, finish_reason=reason)


class BeamSearch:
    """The search over a batch of prompts (token ids), stepped by whoever drives the engine:
    LLM.beam_search below, or the server's `use_beam_search` (entrypoints/openai/serving.py).

        search = BeamSearch(prompts, params, eos_ids, max_model_len)
        while not search.done:
            search.advance(<the first token's logprobs of each of search.pending(), run with
                            search.step_params>)
        search.outputs(tokenizer)
    """

    def __init__(self, prompts: list[list[int]], params: BeamSearchParams, eos_ids: set[int],
                 max_model_len: int):
        self.params, self.eos_ids = params, set(eos_ids)
        num_logprobs = num_candidates(params.beam_width, self.eos_ids)
        if num_logprobs > MAX_LOGPROBS:
            raise ValueError(f"beam_width {params.beam_width} needs {num_logprobs} logprobs "
                             f"per step, over the engine's {MAX_LOGPROBS}")
        for ids in prompts:
            if len(ids) + params.max_tokens > max_model_len:
                raise ValueError(f"a prompt of {len(ids)} tokens + max_tokens "
                                 f"{params.max_tokens} is over max_model_len {max_model_len}")
        self.step_params = SamplingParams(temperature=0, max_tokens=1, logprobs=num_logprobs)
        self.searches = [BeamSearchInstance(len(ids), [BeamSearchSequence(list(ids))])
                         for ids in prompts]

    @property
    def done(self) -> bool:
        return all(s.done for s in self.searches)

    def pending(self) -> list[list[int]]:
        """The running beams of every unfinished prompt: this step's one-token requests."""
        return [beam.tokens for s in self.searches if not s.done for beam in s.running]

    def advance(self, logprobs: list[dict[int, float]]) -> None:
        """logprobs[i]: the top continuations of pending()[i]."""
        rows = iter(logprobs)
        for s in [s for s in self.searches if not s.done]:
            s.advance([next(rows) for _ in s.running], self.params, self.eos_ids)

    def outputs(self, tokenizer) -> list[BeamSearchOutput]:
        for s in self.searches:
            for beam in s.finished:
                end = len(beam.tokens) - (beam.finish_reason == "stop")
                beam.text = tokenizer.decode(beam.tokens[s.prompt_len:end])
        return [BeamSearchOutput(s.finished) for s in self.searches]


def beam_from_output(prompt: list[int], out, length_penalty: float) -> BeamSearchSequence:
    """A finished beam as the engine core reports it (an EngineCoreOutput: core/v0/)."""
    logprobs = list(out.new_logprobs)
    cum_logprob = sum(logprob for entry in logprobs for logprob in entry.values())
    return BeamSearchSequence(prompt + list(out.new_token_ids), logprobs, cum_logprob,
                              cum_logprob / len(logprobs) ** length_penalty,
                              finish_reason=out.finish_reason)


def beam_search(llm, prompts: list[list[int]], params: BeamSearchParams,
                use_tqdm: bool = False, lora_request=None) -> list[BeamSearchOutput]:
    """The beams of each prompt (token ids), every step's beams of all prompts in one
    llm.generate call; see the module's docstring for the rules."""
    engine = llm.engine
    search = BeamSearch(prompts, params, engine.eos_token_ids, engine.model_config.max_model_len)
    with tqdm(total=params.max_tokens, desc="Beam search", disable=not use_tqdm) as bar:
        while not search.done:
            outs = llm.generate(search.pending(), search.step_params, use_tqdm=False,
                                lora_request=lora_request)
            search.advance([out.outputs[0].logprobs[0] for out in outs])
            bar.update()
    return search.outputs(llm.tokenizer)

