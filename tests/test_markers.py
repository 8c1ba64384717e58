"""Snippet markers earn their keep. Code a page quotes carries `# --8<-- [start:NAME]` and
`# --8<-- [end:NAME]` lines, and the page includes it with pymdownx.snippets
(`--8<-- "minivllm/core/scheduler.py:schedule"`), so the site shows the real lines and never
drifts. Three checks:

- in every source file, the markers are balanced and nest properly (an inner section closes
  before its outer one; a name appears once per file);
- every quote in a page (docs/**/*.md) names a file that exists and a marker in it: mkdocs'
  check_paths would find the same at build time, this finds it in the test run;
- every marker is quoted: one nothing quotes is a comment with no reader, so it goes.

The lessons and the site's hooks quote no engine code by marker today (a lesson imports the
engine and runs it; its page is rendered from the run), but a quote in them counts too.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SKIP = {".git", ".venv", "site", "tests", "node_modules", "__pycache__"}

# pymdownx.snippets' section names: a letter, then letters, digits, - and _.
MARKER = re.compile(r"^\s*# --8<-- \[(?P<kind>start|end):(?P<name>[a-z][-_0-9a-z]*)\]\s*$")
QUOTE = re.compile(r'--8<--\s+"(?P<file>[^"]+)"')
BLOCK = re.compile(r"^\s*--8<--\s*$")


def sources() -> list[Path]:
    return sorted(p for p in REPO.rglob("*.py")
                  if not SKIP.intersection(p.relative_to(REPO).parts))


def markers(path: Path) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """name -> (start line, end line) in `path`, and what is wrong with its markers."""
    sections: dict[str, tuple[int, int]] = {}
    problems = []
    open_: list[tuple[str, int]] = []
    where = path.relative_to(REPO)
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if "--8<--" not in line:
            continue
        m = MARKER.match(line)
        if m is None:
            problems.append(f"{where}:{number}: not a marker `# --8<-- [start|end:name]`: {line!r}")
            continue
        name = m["name"]
        if m["kind"] == "start":
            if name in sections or any(name == n for n, _ in open_):
                problems.append(f"{where}:{number}: [start:{name}] again")
            open_.append((name, number))
        elif not open_ or open_[-1][0] != name:
            expected = f"[end:{open_[-1][0]}] first" if open_ else "no section open"
            problems.append(f"{where}:{number}: [end:{name}], but {expected}")
        else:
            _, start = open_.pop()
            if number == start + 1:
                problems.append(f"{where}:{number}: section {name} is empty")
            sections[name] = (start, number)
    problems += [f"{where}:{start}: [start:{name}] never ends" for name, start in open_]
    return sections, problems


def quoting_files() -> list[Path]:
    """The pages, plus the lessons and hooks in case one ever quotes code the same way."""
    return sorted([*(REPO / "docs").rglob("*.md"), *(REPO / "lessons").glob("*.py"),
                   *(REPO / "docs" / "hooks").rglob("*.py")])


def quotes(path: Path) -> list[tuple[str, int, str]]:
    """(where, line, 'file' or 'file:section') for each snippet include in `path`: the inline
    form `--8<-- "file:name"` and the block form (file names between two `--8<--` lines)."""
    found = []
    in_block = False
    where = str(path.relative_to(REPO))
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if BLOCK.match(line):
            in_block = not in_block
        elif in_block and line.strip() and not line.strip().startswith(";"):
            found.append((where, number, line.strip()))
        else:
            found += [(where, number, m["file"]) for m in QUOTE.finditer(line)]
    return found


def test_markers_are_balanced_and_properly_nested():
    problems = [problem for path in sources() for problem in markers(path)[1]]
    assert not problems, "\n".join(problems)


def test_every_quote_resolves_and_every_marker_is_quoted():
    sections = {(str(path.relative_to(REPO)), name)
                for path in sources() for name in markers(path)[0]}
    assert len(sections) >= 10, sections         # the guide quotes a dozen; none found is a bug
    quoted = set()
    problems = []
    for where, number, target in (q for page in quoting_files() for q in quotes(page)):
        file, _, section = target.partition(":")
        if not (REPO / file).is_file():
            problems.append(f"{where}:{number}: quotes {target}, but there is no {file}")
        elif re.fullmatch(r"[-0-9:,]+", section):
            problems.append(f"{where}:{number}: quotes {target} by line numbers; they drift: "
                            "put markers around the lines and quote their name")
        elif section and (file, section) not in sections:
            problems.append(f"{where}:{number}: quotes {target}, but {file} has no "
                            f"'# --8<-- [start:{section}]' ... '[end:{section}]' around lines")
        quoted.add((file, section))
    problems += [f"{file}: marker {name} is quoted by no page: quote it or remove its two lines"
                 for file, name in sorted(sections - quoted)]
    assert not problems, "\n".join(problems)


def test_the_checks_catch_a_broken_file(tmp_path, monkeypatch):
    """The marker rules on a made-up file, so the tests above cannot pass by parsing nothing."""
    monkeypatch.setitem(globals(), "REPO", tmp_path)
    bad = tmp_path / "bad.py"
    bad.write_text("# --8<-- [start:outer]\nx = 1\n# --8<-- [start:inner]\ny = 2\n"
                   "# --8<-- [end:outer]\n# --8<-- [end:inner]\n# --8<-- [start:open]\n"
                   "#--8<-- [end:open]\n")
    sections, problems = markers(bad)
    assert sections == {"inner": (3, 6)}
    assert [p.split(": ", 1)[1] for p in problems] == [
        "[end:outer], but [end:inner] first",
        "not a marker `# --8<-- [start|end:name]`: '#--8<-- [end:open]'",
        "[start:outer] never ends",
        "[start:open] never ends",
    ]
    good = tmp_path / "good.py"
    good.write_text("# --8<-- [start:outer]\nx = 1\n    # --8<-- [start:inner]\n    y = 2\n"
                    "    # --8<-- [end:inner]\n# --8<-- [end:outer]\n")
    assert markers(good) == ({"inner": (3, 5), "outer": (1, 6)}, [])
    page = tmp_path / "page.md"
    page.write_text('```\n--8<-- "good.py:outer"\n```\n    --8<-- "good.py"\n--8<--\nbad.py:x\n'
                    ";skipped.py\n--8<--\n")
    assert quotes(page) == [("page.md", 2, "good.py:outer"), ("page.md", 4, "good.py"),
                            ("page.md", 6, "bad.py:x")]
