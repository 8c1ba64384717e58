"""models/llama.py's `linear`: a plain fp32 nn.Linear on a CPU computed as (W x^T)^T, copied back
to rows (faster at 2-8 rows with MKL) up to 64 rows, its columns padded with zeros (one row to
two, past 8 rows to a multiple of 8); everything else runs its own forward."""

import minivllm.platforms  # noqa: F401, I001  (Triton's interpreter switch first, as everywhere)

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.models.llama import linear


def test_linear_matches_f_linear_and_returns_rows():
    torch.manual_seed(0)
    layer = nn.Linear(576, 1536, bias=True)
    for rows in (1, 4, 16):
        x = torch.randn(rows, 576)
        y = linear(layer, x)
        assert y.shape == (rows, 1536) and y.is_contiguous()      # views downstream need rows
        torch.testing.assert_close(y, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_other_layers_and_dtypes_run_their_own_forward():
    calls = []

    class Wrapped(nn.Linear):                  # what LoRA / quantization / TP layers look like
        def forward(self, x):
            calls.append(x.shape[0])
            return super().forward(x)

    assert linear(Wrapped(8, 4), torch.randn(3, 8)).shape == (3, 4) and calls == [3]
    bf16 = nn.Linear(64, 32, bias=False).to(torch.bfloat16)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert torch.equal(linear(bf16, x), bf16(x))                # bf16 keeps F.linear



def test_the_transposed_call_only_up_to_64_rows(monkeypatch):
    """Decode (<= 64 rows) takes (W x^T)^T; a prefill keeps MKL's own layout, x W^T."""
    layer, first_args = nn.Linear(64, 32, bias=False), []

    def spy(a, *rest):
        first_args.append("W" if a is layer.weight else "x")
        return real(a, *rest)

    real = F.linear
    monkeypatch.setattr(F, "linear", spy)
    for rows in (1, 64, 65, 512):
        x = torch.randn(rows, 64)
        torch.testing.assert_close(linear(layer, x), real(x, layer.weight))
    assert first_args == ["W", "W", "x", "x"]


def test_rows_are_padded_to_the_gemms_blocks(monkeypatch):
    """Batch-1 decode: a one-column product is MKL's matrix-vector path (sgemv), which read the
    113 MB LM head at 17 GB/s against 45 GB/s for two columns; past 8 rows a count off MKL's
    8-column blocks paid for the block (Zen 3: 15 rows 139 ms, 16 rows 70 ms). The zero
    columns are computed and dropped: the rows that come back are the rows that went in."""
    layer, widths = nn.Linear(64, 32, bias=True), []

    def spy(a, b, *rest):
        widths.append(b.shape[0])
        return real(a, b, *rest)

    real = F.linear
    monkeypatch.setattr(F, "linear", spy)
    for rows in (1, 2, 7, 8, 9, 15, 16, 17, 57, 63, 64):
        x = torch.randn(rows, 64)
        y = linear(layer, x)
        assert y.shape == (rows, 32) and y.is_contiguous()
        torch.testing.assert_close(y, real(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    assert widths == [2, 2, 7, 8, 16, 16, 16, 24, 64, 64, 64]


def test_no_padding_while_torch_compile_traces():
    """Traced, each test on the rows would be a guard and each guard a graph of its own: under
    torch.compile `linear` pads only one row, so 3, 9 and 16 rows are one dynamic graph."""
    graphs = []

    def backend(graph, example_inputs):         # a backend that counts the graphs it is given
        graphs.append(graph)
        return graph.forward

    torch.compiler.reset()
    layer = nn.Linear(64, 32, bias=False)
    compiled = torch.compile(lambda x: linear(layer, x), backend=backend, dynamic=True)
    for rows in (3, 9, 16):
        x = torch.randn(rows, 64)
        torch.testing.assert_close(compiled(x), F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
    assert len(graphs) == 1, f"{len(graphs)} graphs for 3, 9 and 16 rows"
