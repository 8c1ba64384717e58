"""The ablation ladder (minivllm/bench_ablation.py): each mechanism switched off in turn on one
workload, over the session's SmolLM2. Counts only; the tokens/s it also reports are not
asserted (a shared machine moves them)."""

from minivllm.bench_ablation import RUNGS, ablation_ladder, ablation_workload


def test_each_rung_changes_the_schedule_not_the_tokens(smol):
    llm = smol()
    requests = ablation_workload(llm.tokenizer, 6)
    rows = ablation_ladder(llm, requests, max_model_len=512, slabs=2, max_num_seqs=4,
                           budget=128)
    assert list(rows) == list(RUNGS)
    full = rows["full engine"]
    for name, r in rows.items():        # greedy, EOS ignored: the same tokens on every rung
        assert r["tokens"] == full["tokens"], name
        assert r["output_tokens"] == full["output_tokens"]
    # Paging: 2 slabs hold 2 requests; the same bytes in blocks hold all 4 slots.
    assert rows["no paging"]["max_running"] == 2 < full["max_running"] == 4
    assert rows["no paging"]["steps"] > full["steps"]
    # Continuous batching: static waits for the slowest of each batch.
    assert rows["no continuous batching"]["steps"] > full["steps"]
    # Prefix caching: without it the shared system prompt is computed for every request.
    assert rows["no prefix caching"]["prefill_tokens"] > full["prefill_tokens"]
    # Chunked prefill off: a whole prompt in one step, so no more steps than with chunks.
    assert rows["no chunked prefill"]["steps"] <= full["steps"]
