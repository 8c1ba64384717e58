"""The two generation endpoints of the OpenAI API (vLLM twin:
vllm/entrypoints/openai/serving_completion.py and serving_chat.py, in one file): request ->
SamplingParams and prompt ids -> AsyncLLMEngine -> one JSON answer, or a stream of
server-sent events ending with `data: [DONE]`.

Streaming sends, per step, each sample's new text as a delta. Text that could still turn out to
be the start of a stop string is held back until it is known not to be (the engine cuts the
text before a stop string only once the string is complete), so the concatenated deltas always
equal the non-streamed text.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from minivllm.beam_search import BeamSearch
from minivllm.engine.async_llm_engine import EngineDeadError
from minivllm.engine.processor import encode_prompt
from minivllm.outputs import CompletionOutput
from minivllm.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest,
                                                  OpenAIError, chat_logprobs, completion_logprobs,
                                                  cut, error_body, now, param_of, random_id)
from minivllm.sampling_params import SamplingParams

async def merge(streams: list[AsyncIterator]) -> AsyncIterator[tuple[int, object]]:
    """Interleave several async iterators as (which, item), as their items come."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    q: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i, s):
        try:
            async for item in s:
                q.put_nowait((i, item))
        except Exception as e:          # noqa: BLE001 -- handed to the reader
            q.put_nowait((i, e))
        finally:
            q.put_nowait((i, done))
    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(tasks)
        while left:
            i, item = await q.get()
            if item is done:
                left -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def until_disconnected(request: Request, work, on_cancel: Callable[[], None] = None):
    """Await `work`, but cancel it (and call on_cancel: abort its requests) if the client goes
    away first."""
    async def disconnected():
        while (await request.receive())["type"] != "http.disconnect":
            pass
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if on_cancel is not None:
                on_cancel()
            raise OpenAIError(499, "the client disconnected; its request was aborted")
    return task.result()


def check_model(app: FastAPI, name: str | None) -> None:
    if name is not None and name != app.state.model_name:
        raise OpenAIError(404, f"The model `{cut(name)}` does not exist; this server serves "
                          f"`{app.state.model_name}`.", "model")


def max_token_chars(tokenizer) -> int:
    """The longest token's text, in characters: a text of C characters has at least
    C / max_token_chars tokens, which bounds a prompt's length before tokenizing it."""
    return max(map(len, tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))))


def too_long(max_len: int, prompt_len: int, want: int, prompt_field: str) -> OpenAIError:
    return OpenAIError(
        400, f"This model's maximum context length is {max_len} tokens. However, you "
        f"requested {prompt_len + want} tokens ({prompt_len} in the {prompt_field}, {want} in "
        f"the completion). Please reduce the length of the {prompt_field} or completion.",
        prompt_field if prompt_len >= max_len else "max_tokens")


def tokenize(app: FastAPI, prompts: list[str | list[int]], prompt_field: str,
             add_special_tokens: bool = False) -> list[list[int]]:
    """Each prompt's token ids (run on a worker thread: a long text takes seconds, which the
    event loop must not spend). A text that cannot fit max_model_len however it tokenizes is
    refused before the tokenizer sees it: a 2 MB prompt cost 570 MB and 3.6 s to learn that."""
    max_len = app.state.aengine.engine.model_config.max_model_len
    limit = max_len * app.state.max_token_chars
    ids = []
    for p in prompts:
        if isinstance(p, str) and len(p) > limit:
            raise OpenAIError(400, f"This model's maximum context length is {max_len} tokens. "
                              f"However, the {prompt_field} has {len(p)} characters, more than "
                              f"{max_len} tokens of at most {app.state.max_token_chars} "
                              f"characters each. Please reduce the length of the "
                              f"{prompt_field}.", prompt_field)
        try:
            ids.append(encode_prompt(app.state.aengine.tokenizer, p, add_special_tokens)
                       if isinstance(p, str) else p)
        except ValueError as e:
            raise OpenAIError(400, str(e).replace("prompt", prompt_field, 1),
                              prompt_field) from None
    return ids


async def start_requests(app: FastAPI, request: Request, request_id: str,
                         prompts: list[str | list[int]], make_params,
                         max_tokens: int | None, default_max_tokens, prompt_field: str,
                         add_special_tokens: bool = False
                         ) -> tuple[list[AsyncIterator], list[int], SamplingParams]:
    """Validate, tokenize and add each prompt; return their output streams (timed), their
    prompt lengths and the SamplingParams. All or nothing: on an error, or if the client
    leaves meanwhile, nothing stays queued."""
    aengine = app.state.aengine
    max_len = aengine.engine.model_config.max_model_len
    t0 = time.perf_counter()
    if not prompts:
        raise OpenAIError(400, f"{prompt_field} is empty: give at least one prompt",
                          prompt_field)
    try:                       # the values first (max_tokens checked here, with a placeholder)
        params = make_params(max_len if max_tokens is None else max_tokens)
    except (TypeError, ValueError) as e:
        raise OpenAIError(400, str(e), param_of(str(e))) from None
    ids = await until_disconnected(request, asyncio.to_thread(tokenize, app, prompts,
                                                              prompt_field, add_special_tokens))
    all_params = []
    for prompt_ids in ids:
        if not prompt_ids:
            raise OpenAIError(400, f"{prompt_field} is empty: give at least one token",
                              prompt_field)
        want = default_max_tokens(len(prompt_ids)) if max_tokens is None else max_tokens
        if len(prompt_ids) + want > max_len:
            raise too_long(max_len, len(prompt_ids), want, prompt_field)
        all_params.append(params if want == params.max_tokens else make_params(want))
    entries = sum(p.n * p.max_tokens * (p.logprobs + 1) for p in all_params
                  if p.logprobs is not None)          # held in memory, and answered, at once
    app.state.limits.check([("logprobs", entries, "max_logprob_entries")])
    # Every prompt queued at once (one drain of the engine's queue, not one step each), and
    # the client watched meanwhile: 10,000 prompts of a client that left are not added.
    adds = [aengine.add_request(f"{request_id}-{i}", prompt_ids, p)
            for i, (prompt_ids, p) in enumerate(zip(ids, all_params))]
    added = await until_disconnected(request, asyncio.gather(*adds, return_exceptions=True),
                                     lambda: abort_all(app, request_id, len(ids)))
    errors = [e for e in added if isinstance(e, BaseException)]
    if errors:
        abort_all(app, request_id, len(ids))
        if isinstance(errors[0], (TypeError, ValueError)):
            raise OpenAIError(400, str(errors[0]),
                              param_of(str(errors[0]), prompt_field)) from None
        raise errors[0]
    return ([app.state.metrics.observe(outputs, t0) for outputs in added], [len(x) for x in ids],
            all_params[-1])


def abort_all(app: FastAPI, request_id: str, count: int) -> None:
    """Abort every engine request of one HTTP request (a no-op for finished ones)."""
    for i in range(count):
        app.state.aengine.abort(f"{request_id}-{i}")


def visible_text(text: str, finished: bool, params: SamplingParams) -> str:
    """What may be streamed so far: hold back a tail that could still become a stop string
    (the engine cuts the text before a stop string once it is complete)."""
    if finished or not params.stop:
        return text
    hold = max(map(len, params.stop)) - 1
    return text[:len(text) - hold] if hold else text


async def json_response(build: Callable[[], dict]) -> Response:
    """A whole answer, built and encoded on a worker thread, not on the event loop (64 samples
    with logprobs are 400,000 entries; FastAPI walks a returned dict with jsonable_encoder)."""
    body = await asyncio.to_thread(lambda: json.dumps(build()).encode())
    return Response(body, media_type="application/json")


def sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def streaming_response(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


def _usage(prompt_lens: list[int], completion_tokens: int) -> dict:
    prompt_tokens = sum(prompt_lens)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


async def stream_events(app: FastAPI, request_id: str, envelope: dict, streams, prompt_lens,
                        params: SamplingParams, include_usage: bool,
                        choice: Callable[[int, str, CompletionOutput, int, int], dict],
                        opening: list[dict], continuous_usage: bool = False
                        ) -> AsyncIterator[str]:
    """SSE body: `opening` choices (chat's role deltas), then per step one chunk per sample that
    has new text or has finished, then the usage chunk if asked for, then [DONE]. With
    continuous_usage (vLLM's stream_options.continuous_usage_stats) every chunk carries the
    usage so far; otherwise, with include_usage, each chunk's usage is null."""
    def chunk(choices):
        usage = {}
        if continuous_usage:
            usage = {"usage": _usage(prompt_lens, sum(sent_tokens.values()))}
        elif include_usage:
            usage = {"usage": None}
        return sse({**envelope, "choices": choices, **usage})
    sent_chars: dict[int, int] = {}
    sent_tokens: dict[int, int] = {}
    finished: set[int] = set()
    completion_tokens = 0
    try:
        for c in opening:
            yield chunk([c])
        async for i, out in merge(streams):
            for c in out.outputs:
                index = i * params.n + c.index
                if index in finished:
                    continue
                text = visible_text(c.text, c.finished, params)
                start = sent_chars.get(index, 0)
                if len(text) == start and not c.finished:
                    continue
                tok_start = sent_tokens.get(index, 0)
                sent_chars[index] = len(text)
                sent_tokens[index] = len(c.token_ids)
                yield chunk([choice(index, text[start:], c, tok_start, start)])
                if c.finished:
                    finished.add(index)
                    completion_tokens += len(c.token_ids)
        if include_usage or continuous_usage:
            yield sse({**envelope, "choices": [],
                       "usage": _usage(prompt_lens, completion_tokens)})
    except EngineDeadError as e:
        yield sse(error_body(503, str(e)))
    finally:
        abort_all(app, request_id, len(streams))
    yield sse("[DONE]")


async def final_outputs(app: FastAPI, request: Request, request_id: str, streams) -> list:
    """Each prompt's finished RequestOutput (non-streaming), unless the client leaves first."""
    async def collect():
        finals = [None] * len(streams)
        async for i, out in merge(streams):
            finals[i] = out
        return finals
    try:
        return await until_disconnected(request, collect())
    finally:
        abort_all(app, request_id, len(streams))


async def beam_search(app: FastAPI, request: Request, req: CompletionRequest, rid: str) -> dict:
    """use_beam_search (vLLM's extra): the n best of n beams per prompt, not streamed. Each
    step's beams go to the engine as one-token requests (BeamSearch, minivllm/beam_search.py),
    checked, added and aborted on a disconnect as any requests are."""
    prompts, n = req.prompts(), req.n
    max_len = app.state.aengine.engine.model_config.max_model_len
    if n < 1:
        raise OpenAIError(400, f"n must be an integer >= 1 (the number of beams), got {n}", "n")
    ids = await until_disconnected(request, asyncio.to_thread(tokenize, app, prompts, "prompt",
                                                              req.add_special_tokens))
    try:
        max_tokens = 16 if req.max_new_tokens is None else req.max_new_tokens   # as vLLM
        search = BeamSearch(ids, req.beam_search_params(max_tokens),
                            app.state.aengine.engine.eos_token_ids, max_len)
    except ValueError as e:      # n too large for the logprobs, max_tokens < 1, a long prompt
        param = ("n" if "beam_width" in str(e) else "max_tokens"
                 if str(e).startswith("max_tokens") else "prompt")
        raise OpenAIError(400, str(e), param) from None
    for step in range(search.params.max_tokens):
        if search.done:
            break
        streams, _, _ = await start_requests(app, request, f"{rid}-{step}", search.pending(),
                                             lambda _: search.step_params, 1, None, "prompt")
        finals = await final_outputs(app, request, f"{rid}-{step}", streams)
        search.advance([out.outputs[0].logprobs[0] for out in finals])
    outs = search.outputs(app.state.aengine.tokenizer)
    choices = [{"index": i * n + j, "text": beam.text, "finish_reason": beam.finish_reason,
                "logprobs": None} for i, out in enumerate(outs)
               for j, beam in enumerate(out.sequences)]
    tokens = sum(len(b.tokens) - len(p) for p, out in zip(ids, outs) for b in out.sequences)
    return {"id": rid, "object": "text_completion", "created": now(),
            "model": app.state.model_name, "choices": choices,
            "usage": _usage([len(p) for p in ids], tokens)}


def add_routes(app: FastAPI) -> None:
    decode = app.state.decode_token
    max_len = app.state.aengine.engine.model_config.max_model_len

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        check_model(app, req.model)
        req.check_supported()
        app.state.limits.check(req.sizes())
        rid = random_id("cmpl")
        if req.use_beam_search:
            return await beam_search(app, request, req, rid)
        k = req.logprobs
        prompts = req.prompts()
        streams, prompt_lens, params = await start_requests(
            app, request, rid, prompts, lambda mt: req.sampling_params(mt, k), req.max_new_tokens,
            lambda p: max(1, min(16, max_len - p)), "prompt", req.add_special_tokens)
        envelope = {"id": rid, "object": "text_completion", "created": now(),
                    "model": app.state.model_name}
        echoed = set()

        def echo(index):             # echo: the prompt's text, before its first text only
            if not req.echo or index in echoed:
                return ""
            echoed.add(index)
            p = prompts[index // params.n]
            return p if isinstance(p, str) else app.state.aengine.tokenizer.decode(p)

        def choice(index, text, c, tok_start, char_start):
            return {"index": index, "text": echo(index) + text, "finish_reason": c.finish_reason,
                    "logprobs": None if k is None else
                    completion_logprobs(c, tok_start, k, decode, char_start)}
        if req.stream:
            return streaming_response(stream_events(app, rid, envelope, streams, prompt_lens,
                                                    params, req.include_usage, choice, [],
                                                    req.continuous_usage))
        finals = await final_outputs(app, request, rid, streams)

        def answer():
            choices = [choice(i * params.n + c.index, c.text, c, 0, 0)
                       for i, out in enumerate(finals) for c in out.outputs]
            tokens = sum(len(c.token_ids) for out in finals for c in out.outputs)
            return {**envelope, "choices": choices, "usage": _usage(prompt_lens, tokens)}
        return await json_response(answer)

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        check_model(app, req.model)
        req.check_supported()
        app.state.limits.check(req.sizes())
        rid = random_id("chatcmpl")
        k = req.logprobs_k()
        try:
            conversation = [{"role": m.role, "content": m.text()} for m in req.messages]
            prompt = await asyncio.to_thread(       # jinja over a long text: not on the loop
                app.state.aengine.tokenizer.apply_chat_template, conversation, tokenize=False,
                add_generation_prompt=req.add_generation_prompt)
        except Exception as e:     # noqa: BLE001 -- jinja's template errors are the user's
            raise OpenAIError(400, f"messages: {e}", "messages") from None
        streams, prompt_lens, params = await start_requests(
            app, request, rid, [prompt], lambda mt: req.sampling_params(mt, k), req.max_new_tokens,
            lambda p: max(1, max_len - p), "messages", req.add_special_tokens)
        envelope = {"id": rid, "object": "chat.completion.chunk", "created": now(),
                    "model": app.state.model_name}

        def logprobs(c, tok_start):
            return None if k is None else chat_logprobs(c, tok_start, k, decode)

        def choice(index, text, c, tok_start, char_start):
            delta = {"content": text} if text else {}
            return {"index": index, "delta": delta, "logprobs": logprobs(c, tok_start),
                    "finish_reason": c.finish_reason}
        if req.stream:
            opening = [{"index": i, "delta": {"role": "assistant", "content": ""},
                        "logprobs": None, "finish_reason": None} for i in range(params.n)]
            return streaming_response(stream_events(app, rid, envelope, streams, prompt_lens,
                                                    params, req.include_usage, choice, opening,
                                                    req.continuous_usage))
        (out,) = await final_outputs(app, request, rid, streams)

        def answer():
            choices = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                        "logprobs": logprobs(c, 0), "finish_reason": c.finish_reason}
                       for c in out.outputs]
            tokens = sum(len(c.token_ids) for c in out.outputs)
            return {**envelope, "object": "chat.completion", "choices": choices,
                    "usage": _usage(prompt_lens, tokens)}
        return await json_response(answer)
