"""The line budget (../shared/STYLE.md, scripts/line_budget.py), printed and enforced: growth
is seen when it happens, and a package over its ceiling fails here."""

import runpy
from pathlib import Path

BUDGET = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "line_budget.py"))


def test_line_budget(capsys):
    problems = BUDGET["report"]()
    with capsys.disabled():
        print("\n" + capsys.readouterr().out, end="")
    assert not problems, "; ".join(problems)


def test_code_lines_leave_out_blanks_comments_and_docstrings(tmp_path):
    source = tmp_path / "m.py"
    source.write_text('"""Module docstring,\non two lines."""\n\n'
                      "# a comment\n"
                      "x = [1,\n     2]  # a trailing comment: the line is code\n\n"
                      "class A:\n    'One line.'\n\n"
                      "    async def f(self):\n        '''Two\n        lines.'''\n"
                      "        return '''not a docstring'''\n")
    # Code: x = [1, / 2] / class A: / async def f / return: five of the fourteen lines.
    assert BUDGET["physical_lines"](source) == 14
    assert BUDGET["code_lines"](source) == 5


def test_every_engine_module_has_exactly_one_package():
    packages = BUDGET["package_files"]()
    engine = sorted((BUDGET["ENGINE"]).rglob("*.py"))
    counted = [path for name, files in packages.items() if name.startswith("minivllm")
               for path in files]
    assert sorted(counted) == engine
    assert set(packages) == set(BUDGET["BUDGETS"]), set(packages) ^ set(BUDGET["BUDGETS"])
