"""LLM: the offline front end, vLLM's `LLM` class in miniature (vLLM twin:
vllm/entrypoints/llm.py).

    llm = LLM()                                  # packaged SmolLM2-135M-Instruct, no network
    outs = llm.generate(["The capital of France is"], SamplingParams(temperature=0))
    outs[0].outputs[0].text

    llm = LLM(multiprocess_mode=True)            # the EngineCore in a process of its own
                                                 # (engine/multiproc/), as a server runs it

Left out, compared with vLLM: embeddings / scoring / classification, the
old guided_options_request argument (SamplingParams.guided_decoding does it), and multi-modal
prompts.
"""

from __future__ import annotations

from tqdm.auto import tqdm

from minivllm.beam_search import BeamSearchOutput, BeamSearchParams, beam_search
from minivllm.engine.llm_engine import LLMEngine
from minivllm.engine.processor import encode_prompt
from minivllm.engine.v0_beam_search import beam_search_in_core
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams

Message = dict[str, str]


class LLM:
    def __init__(self, model: str | None = None, dtype: str = "auto", device: str = "auto",
                 multiprocess_mode: bool | None = None, **engine_kwargs):
        """multiprocess_mode: the EngineCore in its own process (None: as the environment
        variable MINIVLLM_ENABLE_MULTIPROCESSING says, off unless set: lessons look inside)."""
        self.engine = LLMEngine(model, dtype=dtype, device=device,
                                multiprocess_mode=multiprocess_mode, **engine_kwargs)
        self.tokenizer = self.engine.tokenizer
        self._counter = 0

    def __repr__(self) -> str:
        return f"LLM({self.engine!r})"

    def generate(self, prompts: str | list[str] | list[int] | list[list[int]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True, lora_request=None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in the order of `prompts`.

        A prompt is a string or a list of token ids; one SamplingParams applies to all, or give
        one per prompt. Likewise lora_request (minivllm.LoRARequest; None: the base model).
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"got {len(sampling_params)} SamplingParams for "
                             f"{len(prompts)} prompts")
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
        if len(loras) != len(prompts):
            raise ValueError(f"got {len(loras)} LoRA requests for {len(prompts)} prompts")
        ids = []
        try:
            for prompt, params, lora in zip(prompts, sampling_params, loras):
                ids.append(f"gen-{self._counter}")
                self._counter += 1
                self.engine.add_request(ids[-1], prompt, params, lora_request=lora)
        except Exception:
            for rid in ids:                     # leave nothing half-queued behind
                self.engine.abort_request(rid)
            raise
        return self._run(ids, use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="Processed prompts", disable=not use_tqdm,
                   dynamic_ncols=True)
        generated = 0
        while len(finished) < len(ids):
            for out in self.engine.step():
                if out.finished:
                    finished[out.request_id] = out
                    generated += sum(len(o.token_ids) for o in out.outputs)
                    bar.update(1)
            bar.set_postfix_str(f"{generated} tokens out", refresh=False)
        bar.close()
        return [finished[rid] for rid in ids]

    def chat(self, messages: list[Message] | list[list[Message]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True,
             lora_request=None) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation or a list of them, and generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        if not conversations:
            raise ValueError("chat() needs at least one conversation")
        prompts = []
        for conv in conversations:
            if not conv:
                raise ValueError("a conversation must have at least one message")
            for i, m in enumerate(conv):
                if not isinstance(m, dict) or "role" not in m or "content" not in m:
                    raise ValueError(f"message {i} must be a dict with 'role' and 'content', "
                                     f"got {m!r}")
            prompts.append(self.tokenizer.apply_chat_template(
                conv, tokenize=False, add_generation_prompt=add_generation_prompt))
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm,
                             lora_request=lora_request)

    def beam_search(self, prompts: list, params: BeamSearchParams, use_tqdm: bool = False,
                    lora_request=None, method: str = "v1") -> list[BeamSearchOutput]:
        """The beam_width best beams of each prompt, best first (minivllm/beam_search.py).
        A prompt: a string, token ids, {"prompt": ...} or {"prompt_token_ids": [...]}, or a
        conversation (a list of messages, through the chat template).
        method: "v1", vLLM V1's (one-token requests sharing through the prefix cache), or
        "fork", V0's (the beams fork block tables inside the engine core); same beams."""
        if method not in ("v1", "fork"):
            raise ValueError(f"method must be 'v1' or 'fork', got {method!r}")
        ids = []
        for prompt in prompts:
            if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
                prompt = prompt["prompt_token_ids"]
            elif isinstance(prompt, dict):
                prompt = prompt["prompt"]
            elif prompt and isinstance(prompt, list) and isinstance(prompt[0], dict):
                prompt = self.tokenizer.apply_chat_template(prompt, tokenize=False,
                                                            add_generation_prompt=True)
            ids.append(encode_prompt(self.tokenizer, prompt) if isinstance(prompt, str)
                       else list(prompt))
        if method == "fork":
            return beam_search_in_core(self, ids, params, lora_request)
        return beam_search(self, ids, params, use_tqdm=use_tqdm, lora_request=lora_request)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (LLMEngine.reset_prefix_cache), e.g. between two runs of
        a benchmark; False while requests hold blocks."""
        return self.engine.reset_prefix_cache()

    def reconfigure(self, **changes) -> LLM:
        """New engine settings over the weights already loaded (LLMEngine.reconfigure):
        `llm.reconfigure(max_num_seqs=4, enable_prefix_caching=False)`."""
        self.engine.reconfigure(**changes)
        return self
