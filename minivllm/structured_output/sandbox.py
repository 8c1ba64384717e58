"""Compiling a constraint in a process of its own, bounded in time and in memory.

No vLLM twin: vLLM compiles in a thread pool of its engine core, with no bound. Here, a JSON
schema of two thousand required properties compiled for 140 s and then grew the server to
22 GB, until the kernel's OOM killer took it, and every stream with it. xgrammar cannot be
interrupted and a thread cannot be killed, so `minivllm serve` compiles in a child process:

    GrammarSandbox.compile(kind, text, any_whitespace) -> the grammar, serialized (JSON)
        the child (started at the first constraint, kept for the next) compiles it, checks
        that it admits a first token, and sends back xgrammar's JSON of it
        over timeout_s:  of CPU time (RLIMIT_CPU), the kernel ends the child; the next
                         constraint starts a new one (wall-clock time would count the
                         seconds it waited for a core behind the engine's steps)
        over memory_mb:  the child's address space is capped (RLIMIT_AS) at what it had
                         after its imports plus memory_mb; xgrammar's allocation fails, or
                         the child dies: the server's own memory never grows
    either way a ValueError that names the limit and its flag (the server answers 400)

The child runs at a low CPU priority (nice 10) on one thread: on a 2-core machine a compile
at normal priority took a core from every engine step beside it (a 4,000-way guided_choice
held an unrelated stream 5.5 s on a 2-core Zen 5).
"""

from __future__ import annotations

import math
import os
import resource
import signal
import subprocess
import sys
import threading
from multiprocessing.connection import Connection


NICE = 10            # CPU priority: a tenth of a core's share beside a busy engine step
STARTUP_S = 120.0    # the child's imports (xgrammar, torch), on a loaded machine
WALL_FACTOR = 10     # the wall-clock bound, in CPU-time limits: a child stuck elsewhere


class GrammarSandbox:
    """One child process that compiles constraints, one at a time, each within timeout_s of
    CPU and memory_mb of memory; a child that goes over is replaced by the next compile."""

    def __init__(self, tokenizer_info_json: str, timeout_s: float = 30.0,
                 memory_mb: int = 2048):
        if timeout_s <= 0 or memory_mb <= 0:
            raise ValueError(f"the grammar compile limits must be positive, got {timeout_s} s "
                             f"and {memory_mb} MiB")
        self.tokenizer_info_json = tokenizer_info_json
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.child: subprocess.Popen | None = None
        self.requests = self.answers = None   # Connections to and from the child
        self.lock = threading.Lock()          # one compile at a time: one child
        self.num_killed = 0                   # children killed or dead (over a limit)

    def _start(self) -> None:
        down_r, down_w = os.pipe()               # requests down, answers up: framed by
        up_r, up_w = os.pipe()                   # multiprocessing's Connection
        self.child = subprocess.Popen(
            [sys.executable, "-m", "minivllm.structured_output.sandbox", str(self.memory_mb),
             str(down_r), str(up_w)], pass_fds=(down_r, up_w), stdin=subprocess.DEVNULL)
        os.close(down_r)
        os.close(up_w)
        self.requests = Connection(down_w, readable=False)
        self.answers = Connection(up_r, writable=False)
        self._send(self.tokenizer_info_json)

    def _send(self, message) -> None:
        try:
            self.requests.send(message)
        except OSError:                          # the child died; its answer (EOF) says so
            pass

    def _receive(self, timeout_s: float):
        """The child's next answer; None after timeout_s; ("died", None) if it is gone."""
        try:
            return self.answers.recv() if self.answers.poll(timeout_s) else None
        except (EOFError, OSError):
            return ("died", None)

    def compile(self, kind: str, text: str, any_whitespace: bool) -> str:
        """xgrammar's JSON of the compiled constraint; ValueError if it is invalid, admits no
        output, or goes over a limit."""
        with self.lock:
            if self.child is None or self.child.poll() is not None:
                self._start()
            child = self.child
            self._send((kind, text, any_whitespace, self.timeout_s))
            answer = self._receive(STARTUP_S)                   # "started": imports done
            started = answer == "started"
            if started:
                answer = self._receive(self.timeout_s * WALL_FACTOR)
            if answer is None or answer[0] == "died":
                self.close()                 # killed (wall clock), or dead: a new one next
                self.num_killed += 1
        if not started:                      # a bug or a broken install, not the request's
            raise RuntimeError(f"the grammar compiler's process did not start (exit code "
                               f"{child.returncode})")
        if child.returncode == -signal.SIGXCPU:
            raise ValueError(f"guided_decoding: compiling the constraint took over "
                             f"{self.timeout_s:g} s of CPU, this server's limit "
                             "(--max-grammar-compile-seconds)")
        if answer is None:
            raise ValueError(f"guided_decoding: compiling the constraint did not finish in "
                             f"{self.timeout_s * WALL_FACTOR:g} s on this busy server (its "
                             f"limit: {self.timeout_s:g} s of CPU, --max-grammar-compile-seconds)")
        status, value = answer
        if status == "ok":
            return value
        if status == "memory":
            raise ValueError(f"guided_decoding: compiling the constraint needs more than "
                             f"{self.memory_mb} MiB, this server's limit "
                             "(--max-grammar-compile-memory-mb)")
        if status == "died":
            raise ValueError(f"guided_decoding: the compiler's process died compiling the "
                             f"constraint (exit code {child.returncode}; its memory limit is "
                             f"{self.memory_mb} MiB, --max-grammar-compile-memory-mb)")
        raise ValueError(value)

    def close(self) -> None:
        if self.child is not None:
            self.child.kill()
            self.child.wait()
            self.requests.close()
            self.answers.close()
            self.child = None


def _child(memory_mb: int, requests_fd: int, answers_fd: int) -> None:
    """The child's loop: compile each request, answer, until the parent closes its end."""
    import xgrammar as xgr

    from minivllm.structured_output.compiler import compile_constraint, make_compiler
    os.nice(NICE)
    requests = Connection(requests_fd, writable=False)
    answers = Connection(answers_fd, readable=False)
    info = xgr.TokenizerInfo.deserialize_json(requests.recv())
    compiler = make_compiler(info, max_threads=1)
    compile_constraint(compiler, info.vocab_size, "regex", "a")    # its set-up, before limits
    with open("/proc/self/statm") as f:       # pages of address space after the imports
        start = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = start + memory_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    while True:
        try:
            kind, text, any_whitespace, timeout_s = requests.recv()
        except EOFError:
            return
        answers.send("started")
        used = resource.getrusage(resource.RUSAGE_SELF)     # this compile's CPU: SIGXCPU
        cpu = math.ceil(used.ru_utime + used.ru_stime + timeout_s)         # past it
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, resource.RLIM_INFINITY))
        try:
            grammar = compile_constraint(compiler, info.vocab_size, kind, text, any_whitespace)
            answer = ("ok", grammar.serialize_json())
        except MemoryError:
            answer = ("memory", None)
        except RuntimeError as e:
            answer = ("memory", None) if "bad_alloc" in str(e) else ("invalid", str(e))
        except ValueError as e:
            answer = ("invalid", str(e))
        except Exception as e:                  # noqa: BLE001 -- xgrammar's, or a bug
            answer = ("invalid", f"guided_decoding: the constraint did not compile: {e!r}")
        answers.send(answer)


if __name__ == "__main__":
    _child(*map(int, sys.argv[1:4]))
