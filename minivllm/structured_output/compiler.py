"""One constraint -> xgrammar's CompiledGrammar: the compile and the checks on what it gives,
with nothing of the engine's, so that the sandbox's child process runs only this
(StructuredOutputManager.compile_text in the engine's process, sandbox.py's child out of it).
vLLM twin: vllm/v1/structured_output/backend_xgrammar.py, compile_grammar.
"""

from __future__ import annotations

import json
import re

NAMES = {"json": "JSON schema", "regex": "regex", "grammar": "grammar"}


def make_compiler(tokenizer_info, max_threads: int):
    """xgrammar's GrammarCompiler for a vocabulary; its own cache off (the manager's is the
    bounded one)."""
    import xgrammar as xgr
    return xgr.GrammarCompiler(tokenizer_info, max_threads=max_threads, cache_enabled=False)


def choice_grammar(choices: list[str]) -> str:
    """An EBNF grammar whose only sentences are the choices (vLLM builds the same)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def compile_constraint(compiler, vocab_size: int, kind: str, text: str,
                       any_whitespace: bool = True):
    """A CompiledGrammar for the constraint `text` of `kind` (json, json_object, regex, choice
    as a JSON list, grammar), or a ValueError with xgrammar's reason."""
    try:
        if kind == "json":
            grammar = compiler.compile_json_schema(text, any_whitespace=any_whitespace)
        elif kind == "json_object":
            grammar = compiler.compile_builtin_json_grammar()
        elif kind == "regex":
            grammar = compiler.compile_regex(text)
        elif kind == "choice":
            grammar = compiler.compile_grammar(choice_grammar(json.loads(text)))
        else:
            grammar = compiler.compile_grammar(text)
    except Exception as e:   # noqa: BLE001 (RuntimeError mostly; a few of xgrammar's own)
        raise ValueError(f"guided_decoding: invalid {NAMES.get(kind, kind)}: "
                         f"{_reason(e)}") from None
    check_admits_output(grammar, vocab_size, kind)
    return grammar


def check_admits_output(grammar, vocab_size: int, kind: str) -> None:
    """Refuse a constraint that compiles but allows no first token (a schema that only refers
    to itself, such as {"$ref": "#"}): served, it would fail at its first step."""
    import xgrammar as xgr
    matcher = xgr.GrammarMatcher(grammar)
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    matcher.fill_next_token_bitmask(bitmask)
    if not bitmask.any() and not matcher.is_terminated():
        raise ValueError(f"guided_decoding: the {NAMES.get(kind, kind)} admits no output: no "
                         "token can start it (a schema or rule that only refers to itself, or "
                         "a character class that matches nothing)")


def _reason(error: Exception) -> str:
    """xgrammar's message without its C++ source location prefix."""
    return re.sub(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?", "",
                  str(error)).strip()
