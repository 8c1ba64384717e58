"""The benchmark commands run end to end through `minivllm bench NAME` (tiny settings: these
check the plumbing and the printed report, not speed), and the registry the CLI walks."""

import re

import pytest

from minivllm.benchmarks.main import BENCHMARKS
from minivllm.entrypoints import cli


def main(argv: list[str]) -> None:
    cli.main(["bench", *argv])


def test_throughput_report(capsys):
    main(["throughput", "--num-requests", "2", "--static-batch", "1", "--hf-batch-sizes", "2"])
    out = capsys.readouterr().out
    rates = [float(x) for x in re.findall(r"([\d.]+) output tok/s", out)]
    assert len(rates) == 3 and all(r > 0 for r in rates), out     # continuous, static, HF
    assert "static batches of 1: continuous is" in out
    assert re.search(r"ratio \(minivllm / best transformers\): [\d.]+x", out), out


def test_decode_report(capsys):
    main(["decode", "--batch-sizes", "1", "2", "--prompt-len", "8", "--max-tokens", "4",
          "--repeats", "1"])
    rows = re.findall(r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x$", capsys.readouterr().out,
                      re.MULTILINE)
    assert [int(r[0]) for r in rows] == [1, 2]
    assert all(float(x) > 0 for r in rows for x in r[1:])


def test_spec_report(capsys):
    """Speculative decoding on vs off: outputs identical, and the copying workload accepts
    drafts (fewer steps than without speculation)."""
    main(["spec", "--batch-sizes", "1", "--max-tokens", "12", "--k", "3"])
    out = capsys.readouterr().out
    rows = re.findall(r"^(\S+)?\s+1\s+-\s+(\d+)\s.*\n\s+3\s+(\d+)\s+([\d.]+)%\s+([\d.]+)\s+"
                      r"([\d.]+)\s+([\d.]+)x\s+(\w+)$", out, re.MULTILINE)
    assert [r[0] for r in rows] == ["repetitive", "free-form"], out
    assert all(r[-1] == "True" for r in rows), out
    repetitive = rows[0]
    assert int(repetitive[2]) < int(repetitive[1]) and float(repetitive[3]) > 50, out


def test_beam_report(capsys):
    """Beam search both ways: the forks compute each token once (fewer than k independent
    sequences, which compute the prompt k times), sharing blocks and copying on write; V1's
    way computes more, less with the prefix cache than without; the beams are the same."""
    main(["beam", "--beam-width", "2", "--max-tokens", "3"])
    out = capsys.readouterr().out
    rows = dict((name.strip(), [int(x) for x in nums.split()[:6]]) for name, nums in re.findall(
        r"^(beam search, V0's design: forks in the core|beam search, V1's way, cache o\w+"
        r"|2 independent greedy sequences)\s+([\d ]+)", out, re.MULTILINE))
    fork, on, off, apart = (rows["beam search, V0's design: forks in the core"],
                            rows["beam search, V1's way, cache on"],
                            rows["beam search, V1's way, cache off"],
                            rows["2 independent greedy sequences"])
    assert fork[0] == on[0] == off[0] == apart[0] == 3, out             # steps
    assert fork[1] < apart[1] < on[1] < off[1], out                     # computed
    assert on[2] > 0 == off[2] == fork[2], out                          # cached
    assert fork[4] > 0 and fork[5] > 0 == on[5] == apart[5], out        # shared, copied
    assert "identical: True" in out, out


def test_offload_report(capsys):
    """The CPU tier off and on: the chats' later turns and the preempted requests compute
    fewer prompt tokens with it, found in the CPU tier, and the outputs are identical."""
    main(["offload", "--conversations", "3", "--turns", "2", "--system-tokens", "64",
          "--requests", "3", "--max-tokens", "4", "--num-kv-blocks", "12",
          "--kv-offloading-size", "0.05"])
    out = capsys.readouterr().out
    rows = {(name, tier): [int(x) for x in nums.split()] for name, tier, nums in re.findall(
        r"^(multi-turn|preemption)\s+(off|on)\s+(\d+\s+\d+\s+\d+\s+\d+)", out, re.MULTILINE)}
    off, on = rows["multi-turn", "off"], rows["multi-turn", "on"]
    assert on[0] == off[0] and on[1] < off[1] and on[3] > 0 == off[3], out
    assert out.count("identical outputs: True") == 2, out


def test_routing_report(capsys):
    """Two replicas, three chats of three turns: prefix-aware routing keeps every later turn
    on its chat's replica and computes fewer prompt tokens than round-robin, which moves
    them; the outputs are the same under every policy."""
    main(["routing", "--conversations", "3", "--turns", "3", "--system-tokens", "64",
          "--max-tokens", "4", "--num-kv-blocks", "64"])
    out = capsys.readouterr().out
    rows = {policy: (int(prompt), int(computed), stayed) for policy, prompt, computed, stayed
            in re.findall(r"^(round_robin|score|prefix)\s+(\d+)\s+(\d+)\s.*\s(\d+)%$",
                          out, re.MULTILINE)}
    assert rows["prefix"][2] == "100" and rows["round_robin"][2] != "100", out
    assert rows["prefix"][0] == rows["round_robin"][0], out                 # same prompts
    assert rows["prefix"][1] < rows["round_robin"][1], out
    assert "identical outputs under every policy: True" in out, out


def test_host_report(capsys):
    """`minivllm bench host` on the tiny random model: a row per batch and mode, the forward
    and every other phase timed, and the same tokens under async scheduling."""
    main(["host", "--models", "tiny", "--batch-sizes", "1", "2", "--steps", "4"])
    rows = re.findall(r"^\s+tiny\s+(\d+)\s+(sync|async)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+"
                      r"\d+%((?:\s+[\d.]+){4})\s+(True|False)$", capsys.readouterr().out, re.M)
    assert [(r[0], r[1]) for r in rows] == [("1", "sync"), ("2", "sync"), ("1", "async"),
                                            ("2", "async")], rows
    for _, _, itl, forward, host, phases, same in rows:
        assert float(itl) > 0 and float(forward) > 0
        assert all(float(x) > 0 for x in phases.split()) and same == "True"


def test_lora_report(capsys):
    """Multi-LoRA: base, mixed and one-at-a-time rows for each N, and the memory line."""
    main(["lora", "--num-adapters", "1", "2", "--num-requests", "2", "--max-tokens", "2",
          "--rank", "4"])
    out = capsys.readouterr().out
    rows = re.findall(r"^(base|base\+lora-off|mixed|one-at-a-time)\s+(\S+)\s+([\d.]+)\s+"
                      r"([\d.]+)x", out, re.MULTILINE)
    assert [(r[0], r[1]) for r in rows] == [
        ("base", "-"), ("base+lora-off", "-"), ("mixed", "1"), ("one-at-a-time", "1"),
        ("mixed", "2"), ("one-at-a-time", "2")], out
    assert all(float(r[2]) > 0 for r in rows), out
    m = re.search(r"slot ([\d.]+) MiB.* ([\d.]+) MiB \((\d+)x a slot\)", out)
    assert m and float(m[1]) > 0 and int(m[3]) > 50, out      # rank 4: ~100x a slot


def test_cpu_report(capsys):
    """`minivllm bench cpu` at tiny settings, a float and a quantized format: the served rate,
    the FLOP rate against the matmul peak and against the same linears alone, the step
    breakdown (shares summing to 1), batch-1 decode against its read-bandwidth roofline (the
    run's threads and one core's) and its GEMVs alone, the batch-1 profile (shares summing to
    1), and the closing tables: int8 reads well under half of fp32's bytes a token. With
    --compile (float32's run only: with int8's compiled too this test took 212 s on a Zen 3,
    118 s without), a compiled row in both tables."""
    from minivllm.benchmarks.cpu import read_bandwidth

    assert read_bandwidth(1, mib=16) > 1e8                      # > 0.1 GB/s: it measured
    tiny = ["--num-prompts", "2", "--hf-batch-sizes", "", "--no-reference", "--max-tokens", "6"]
    main(["cpu", "--dtypes", "float32", "--compile", *tiny])
    main(["cpu", "--dtypes", "int8", *tiny])
    out = capsys.readouterr().out
    # the peak probe is one 1024 x 1024 shape timed on a shared machine: a busy neighbour can
    # leave the served rate above it, and then the report says so instead of a share
    assert re.search(r"minivllm\s+:\s+[\d.]+ output tok/s .* = "
                     r"(\d+% of the matmul peak|above the measured peak)", out), out
    assert re.search(r"its linears alone\s+:\s+[\d.]+ GFLOP/s .*: \d+% of it", out), out
    assert re.search(r"its GEMVs alone\s+:\s+[\d.]+ tok/s \(\d+% of the roofline\)", out), out
    for line in re.findall(r"^step time \(profile\) : (.*)$", out, re.M):
        shares = [int(x) for x in re.findall(r"(?:matmul|attention|other) (\d+)%", line)]
        assert len(shares) == 3 and abs(sum(shares) - 100) <= 2, out
    assert re.search(r"batch-1 decode\s+:\s+[\d.]+ tok/s, roofline [\d.]+ tok/s .*: \d+%; "
                     r"one core's read roofline [\d.]+ tok/s: \d+%", out), out
    profiles = re.findall(r"^batch-1 step \(profile\): (.*)$", out, re.M)
    assert len(profiles) == 2, out
    for line in profiles:
        shares = dict((k, int(v)) for k, v in re.findall(r"([a-z][a-z+ ]*?) (-?\d+)%", line))
        assert list(shares) == ["matmul", "attention", "other ops", "python+dispatch", "sample",
                                "engine"] and abs(sum(shares.values()) - 100) <= 3, out
        assert shares["matmul"] > 0, out
    read = {}
    for fmt in ("float32", "int8"):
        m = re.search(rf"^\| {fmt} \| (\d+) MB \| [\d.]+ \| [\d.]+ \| \d+% \| [\d.]+ \| - \| - \|$",
                      out, re.M)
        assert m, out
        read[fmt] = int(m[1])
        assert re.search(rf"^\| {fmt} \| [\d.]+ \|( -?\d+% \|){{6}}$", out, re.M), out
    assert 500 < read["float32"] < 560 and read["int8"] < 0.45 * read["float32"], read
    # --compile: float32 again, compiled
    assert re.search(rf"^\| float32 compiled \| {read['float32']} MB \| [\d.]+ \| [\d.]+ \| "
                     r"\d+% \| [\d.]+ \| - \| - \|$", out, re.M), out
    assert re.search(r"^\| float32 compiled \| [\d.]+ \|( -?\d+% \|){6}$", out, re.M), out


# Every name the docs, README and lessons use: a rename or a lost entry fails here.
NAMES = ["serve", "throughput", "decode", "prefix", "load", "spec", "tp", "compile", "guided",
         "quant", "lora", "ablation", "disagg", "cpu", "gpu", "kernels", "beam", "parallel",
         "offload", "routing", "host"]


def test_every_benchmark_is_in_the_registry():
    assert sorted(BENCHMARKS) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_bench_help(name, capsys):
    """`minivllm bench NAME --help` parses: its own flags and the shared ones it takes, once."""
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: minivllm bench {name}"), out
    for flag in BENCHMARKS[name][2]:
        assert out.count(f"--{flag} ") == 2, out              # in the usage line and the list
