"""Speculative decoding (vLLM twin: vllm/v1/spec_decode/): guess k tokens cheaply, check them all
in one target forward, keep exactly what the target model would have produced (Leviathan et al.
2023, Chen et al. 2023).

    decoder.py          SpeculativeDecoder: the model runner's drafter, over a proposer;
                        returns each sample's drafts
    ngram_proposer.py   prompt lookup: the drafts are what followed the last n tokens before
    draft_model.py      a smaller model with the target's vocabulary guesses greedily

It plugs into the engine at four named seams, and nowhere else:

    1. propose     ModelRunner.execute_model, after sampling: SpeculativeDecoder.propose drafts
                   for every sample that sampled and has room, from the runner's own state
                   (worker/model_runner.py; Worker.initialize_cache builds the drafter with
                   make_drafter); the drafts ride in the ModelRunnerOutput, and EngineCore.step
                   hands them to Scheduler.update_draft_token_ids for the next step
                   (engine/core.py)
    2. lookahead   Scheduler.schedule fits the drafts into the token budget and reserves their
                   lookahead slots, or drops them: speculation never preempts (core/scheduler.py)
    3. verify      ModelRunner computes the drafts after the sequence's last token (k + 1 logits
                   rows) and accept_drafts keeps what the target agrees with
                   (worker/model_runner.py, sample/rejection_sampler.py)
    4. roll back   Scheduler.update_from_output appends the accepted tokens, counts them, and
                   frees the lookahead slots of the rejected drafts (core/scheduler.py)
"""
