"""A token budget that keeps one engine step under a stated time on a CPU.

Chunked prefill bounds what a decoding stream waits through only if a chunk is small enough
for the machine. vLLM picks `max_num_batched_tokens` from a table (by device and usage
context: 2048 for its server on a GPU), sized for a GPU step of about a tenth of a second; on
a 2-core CPU a step of 2048 tokens takes seconds, and every stream waits through each one. So
`minivllm serve` on a CPU, when --max-num-batched-tokens is not given, measures the machine:

    fit_step_budget(engine, bound_s)   one probe prompt prefilled in chunks, then three decode
                                       steps, timed by the core (engine.trace()); a fit of
                                       t(n, L) = a + n (b + c L): a the step's fixed cost (the
                                       fastest decode), b a token's own cost and c its attention
                                       per token of context L (the chunks, deeper and deeper);
                                       the engine reconfigured to the largest budget B whose
                                       step at the longest context, a + B (b + c max_model_len),
                                       stays under bound_s

A step holds at most B tokens (decodes and prefill chunks alike), each at a context of at most
max_model_len, so the fit bounds every step's time, not just the probe's. What it leaves out:
the fixed cost grows a little with the number of sequences (the sampler, Python per request).

No vLLM twin: vLLM's table (EngineArgs' defaults by UsageContext) has no measurement in it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from minivllm.sampling_params import SamplingParams

PROBE_CHUNK = 256           # tokens per probe step
PROBE_TOKENS = 2048         # the probe prompt's length, at most (about 4 s on a 2-core CPU)
MAX_BUDGET = 2048           # vLLM's server default: never more than a GPU would take


@dataclass(frozen=True)
class StepBudget:
    budget: int             # max_num_batched_tokens chosen
    bound_s: float          # the step time it keeps under
    fixed_s: float          # a: a step's fixed cost
    token_s: float          # b: one token's own cost
    attention_s: float      # c: one token's attention cost per token of context
    max_model_len: int

    def step_s(self, num_tokens: int, context: int | None = None) -> float:
        """The fitted time of a step of num_tokens at `context` (default: max_model_len)."""
        context = self.max_model_len if context is None else context
        return self.fixed_s + num_tokens * (self.token_s + self.attention_s * context)

    def __str__(self) -> str:
        return (f"token budget {self.budget} per step, so that a step stays under "
                f"{self.bound_s:g} s at {self.max_model_len} tokens of context on this CPU "
                f"(measured: {self.fixed_s * 1e3:.0f} ms a step + {self.token_s * 1e3:.2f} ms a "
                f"token + {self.attention_s * 1e6:.3f} us a token per token of context); "
                f"--max-num-batched-tokens N sets it")


def fit_step_budget(engine, bound_s: float = 1.0) -> StepBudget:
    """Time a probe prompt on `engine` (an LLMEngine with nothing in flight), then reconfigure
    it to the budget that keeps a step under bound_s; the chosen StepBudget is returned."""
    if bound_s <= 0:
        raise ValueError(f"the step bound must be positive, got {bound_s} s")
    max_model_len = engine.vllm_config.scheduler_config.max_model_len
    settings = {"max_num_batched_tokens": engine.engine_args.max_num_batched_tokens,
                "enable_prefix_caching": engine.engine_args.enable_prefix_caching}
    engine.reconfigure(max_num_batched_tokens=PROBE_CHUNK, enable_prefix_caching=False)
    try:
        prompt = [1000 + i % 5000 for i in range(min(PROBE_TOKENS, max_model_len - 4))]
        with engine.trace() as steps:
            engine.add_request("step-budget-probe", prompt,
                               SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
            while engine.has_unfinished_requests():
                engine.step()
    finally:
        engine.reconfigure(**settings)
    prefill, decodes = steps[:-3], steps[-3:]
    fixed_s = min(s.duration for s in decodes)   # one token each: the fixed cost, nearly
    n = np.array([s.num_batched_tokens for s in prefill])
    context = np.cumsum(n) - n / 2               # what a chunk's tokens see, on average
    keep = slice(1 if len(n) > 2 else 0, None)   # the first chunk warms up
    per_token = np.maximum([s.duration - fixed_s for s in prefill], 0.0)[keep] / n[keep]
    c, b = np.polyfit(context[keep], per_token, 1) if len(per_token) > 1 else (0, per_token[0])
    fit = StepBudget(0, bound_s, fixed_s, max(float(b), 1e-6), max(float(c), 0.0), max_model_len)
    budget = (bound_s - fixed_s) / (fit.step_s(1) - fixed_s) // 16 * 16
    fit = dataclasses.replace(fit, budget=int(min(max(budget, 16), MAX_BUDGET)))
    engine.reconfigure(max_num_batched_tokens=fit.budget)
    return fit
