"""The line budget (../shared/STYLE.md), printed and enforced: growth is seen when it happens."""

import runpy
from pathlib import Path

BUDGET = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "line_budget.py"))


def test_line_budget(capsys):
    problems = BUDGET["report"]()
    with capsys.disabled():
        print("\n" + capsys.readouterr().out, end="")
    assert not problems, "; ".join(problems)
