"""Beam search in the engine core, vLLM V0's design: the driver of `LLM.beam_search(...,
method="fork")`. Each prompt goes to the core as one request whose beams fork there, sharing
block tables copy-on-write (core/v0/beam_group.py, by the rules of minivllm/beam_search.py),
on V0's scheduler for the call. V1's driver, beam_search.beam_search, sends each step's beams
as requests of one token instead. Counted with core/v0/ (scripts/line_budget.py)."""

from __future__ import annotations

import dataclasses
import itertools

from minivllm.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams, beam_from_output
from minivllm.config.scheduler import V0_SCHEDULER
from minivllm.engine.core import EngineCoreRequest

_core_search_ids = itertools.count()


def beam_search_in_core(llm, prompts: list[list[int]], params: BeamSearchParams,
                        lora_request=None) -> list[BeamSearchOutput]:
    """V0's design (LLM.beam_search(method="fork")): each prompt goes to the engine core as one
    request whose beams fork there (core/v0/beam_group.py; the engine runs V0's scheduler for
    the call); the core reports the finished beams, as "0_{id}", "1_{id}", ..., best first."""
    config = llm.engine.vllm_config
    if (config.speculative_config is not None
            or config.parallel_config.pipeline_parallel_size > 1):
        raise ValueError("beam search in the core does not run with speculative decoding "
                         "or pipeline parallelism: use method='v1'")
    was = config.scheduler_config.scheduler_cls
    if was != V0_SCHEDULER:
        llm.reconfigure(scheduler_cls=V0_SCHEDULER)
    try:
        engine = llm.engine
        search = BeamSearch(prompts, params, engine.eos_token_ids,   # checks the prompts
                            engine.model_config.max_model_len)
        beam_params = dataclasses.replace(search.step_params, max_tokens=params.max_tokens)
        if lora_request is not None:
            engine.engine_core.add_lora(lora_request)
        request_ids = [f"beams-{next(_core_search_ids)}" for _ in prompts]
        for request_id, prompt in zip(request_ids, prompts):
            engine.engine_core.add_request(EngineCoreRequest(
                request_id, prompt, beam_params, lora_request, beam_search=params))
        hypotheses = {f"{i}_{request_id}": request_id for request_id in request_ids
                      for i in range(params.beam_width)}
        finished = {request_id: [] for request_id in request_ids}
        while engine.engine_core.has_unfinished_requests():
            for out in engine.engine_core.get_output().outputs:
                if out.error is not None:     # the others go too, and the error says why
                    engine.engine_core.abort_requests(request_ids)
                    raise RuntimeError(f"beam search of {out.request_id} failed: {out.error}")
                if out.request_id in hypotheses:
                    finished[hypotheses[out.request_id]].append(out)
    finally:
        if was != V0_SCHEDULER:
            llm.reconfigure(scheduler_cls=was)
    for instance, prompt, request_id in zip(search.searches, prompts, request_ids):
        instance.finished = [beam_from_output(prompt, out, params.length_penalty)
                             for out in finished[request_id]]
    return search.outputs(llm.tokenizer)
