"""No import cycles in minivllm/: the graph is computed from the source with `ast`, every
`import` and `from ... import` counted, at module level and inside functions alike (a lazy
import hides a cycle from Python, not from a reader: the two modules still need each other).

An edge A -> B means module A names module B in an import:
  `import pkg.mod`              -> pkg.mod
  `from pkg import mod`         -> pkg.mod, when pkg/mod.py (or pkg/mod/) exists
  `from pkg import Name`        -> pkg (its __init__ defines or re-exports Name)
  `from . import x`, `from ..y` -> resolved against A's package first
Executing a parent package's __init__ (Python runs minivllm/core/__init__.py before
minivllm/core/scheduler.py) is not an edge: every module would otherwise depend on every
__init__ above it, and a reader does not see that import in the file.

The same graph collapsed to packages (each first-level package under minivllm/ one node, each
top-level module one of its own) must have no cycle either, but for the ones
ALLOWED_PACKAGE_CYCLES names while they are being removed.

kernels/ being a leaf (it imports nothing from minivllm) is tests/test_kernels_leaf.py's job.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def module_names(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under `root` (a package's name is its folder)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imported_modules(module: str, path: Path, known: set[str]) -> dict[str, int]:
    """The known modules that `module` (in file `path`) imports -> the first line naming each."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:                       # relative: climb level - 1 packages up
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            submodules = [f"{base}.{alias.name}" for alias in node.names]
            targets = [t for t in submodules if t in known] or [base]
            # `from pkg import mod, Name`: the module is an edge, and so is pkg for Name.
            if len(targets) < len(node.names) and targets != [base]:
                targets.append(base)
        else:
            continue
        for target in targets:
            # `import minivllm.core.scheduler.Scheduler` cannot happen, but `import a.b` where
            # only `a` is ours can: take the longest prefix that is one of our modules.
            parts = target.split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()
            name = ".".join(parts)
            if name and name != module:
                found.setdefault(name, node.lineno)
    return found


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    modules = module_names(root)
    known = set(modules)
    return {m: imported_modules(m, p, known) for m, p in modules.items()}


def cycles(graph: dict[str, dict]) -> list[list[str]]:
    """Each strongly connected component as one concrete cycle A -> B -> ... -> A found inside
    it, sorted."""
    return sorted(cycle_in(graph, c) for c in components(graph))


def components(graph: dict[str, dict]) -> list[set[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative): the
    nodes that all reach each other through imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            child = next((w for w in edges if w in graph), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def cycle_in(graph: dict[str, dict], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first inside it)."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node]):
                if nxt == start:
                    return paths[node] + [start]
                if nxt in component and nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")


def describe(graph: dict[str, dict[str, int]], cycle: list[str], root: Path) -> str:
    """`a (a.py:12) -> b (b.py:40) -> a`: where each import of the cycle is written."""
    modules = module_names(root)
    steps = [f"{a} ({modules[a].relative_to(root.parent)}:{graph[a][b]})"
             for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(steps + [cycle[-1]])


def package_of(module: str) -> str:
    """A module's node in the package graph: its first-level package under the root
    (minivllm.core.scheduler -> minivllm.core); a top-level module (minivllm.config,
    minivllm.forward_context) and the root's __init__ (minivllm) are nodes of their own."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, dict[str, int]]) -> dict[str, dict[str, tuple[str, int]]]:
    """The module graph collapsed to packages: A -> B when a module of A imports a module of
    B, with the first such import, (module, line), to say where."""
    packages: dict[str, dict[str, tuple[str, int]]] = {package_of(m): {} for m in graph}
    for module, edges in graph.items():
        for target, line in edges.items():
            if package_of(target) != package_of(module):
                packages[package_of(module)].setdefault(package_of(target), (module, line))
    return packages


def describe_packages(packages: dict[str, dict[str, tuple[str, int]]], component: set[str],
                      root: Path) -> str:
    """`minivllm.a (minivllm/a/x.py:12) -> minivllm.b (minivllm/b/y.py:40) -> minivllm.a`: one
    cycle of the component, and the import that makes each step."""
    modules = module_names(root)
    cycle = cycle_in(packages, component)
    steps = []
    for a, b in zip(cycle, cycle[1:]):
        module, line = packages[a][b]
        steps.append(f"{a} ({modules[module].relative_to(root.parent)}:{line})")
    return " -> ".join(steps + [cycle[-1]]) + f"   [all of: {', '.join(sorted(component))}]"


# The package cycles allowed for now: a cycle may stay within one of these sets of packages.
# Any other fails, and so does an allowance that no cycle needs any more (delete it then).
ALLOWED_PACKAGE_CYCLES: dict[str, set[str]] = {
    # None now. The last, benchmarks <-> simulator, went when the `minivllm simulate` command
    # (benchmarks/simulate.py) moved into the simulator as simulator/cli.py: the simulator
    # imports the benchmarks' workloads and roofline, and nothing in benchmarks/ imports it.
}


def test_minivllm_packages_have_no_import_cycles():
    """Two packages that import each other are one package in two folders, even when no two
    of their modules do: a reader cannot take either alone, nor move one without the other."""
    root = REPO / "minivllm"
    packages = package_graph(import_graph(root))
    assert {"minivllm", "minivllm.config", "minivllm.core", "minivllm.forward_context"} <= set(
        packages)
    assert "minivllm.engine" in packages["minivllm.llm"], packages["minivllm.llm"]
    found = components(packages)
    remaining = "every package cycle in minivllm/:\n" + "\n".join(
        "  " + describe_packages(packages, c, root) for c in found)
    allowed = ALLOWED_PACKAGE_CYCLES.items()
    unexpected = [c for c in found if not any(c <= packages_ for _, packages_ in allowed)]
    assert not unexpected, f"{len(unexpected)} package cycle(s) not allowed; {remaining}"
    stale = [name for name, packages_ in allowed if not any(c <= packages_ for c in found)]
    assert not stale, f"{stale}: no package cycle needs it any more, delete it; {remaining}"


def test_minivllm_has_no_import_cycles():
    root = REPO / "minivllm"
    graph = import_graph(root)
    # The graph is real (the public API reaches the engine); the import forms are checked below.
    assert "minivllm.engine.llm_engine" in graph["minivllm.llm"], graph["minivllm.llm"]
    assert sum(len(edges) for edges in graph.values()) > 100
    found = cycles(graph)
    assert not found, f"{len(found)} import cycle(s) in minivllm/:\n" + "\n".join(
        "  " + describe(graph, cycle, root) for cycle in found)


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """The rules in the docstring, on a made-up package, so the cycle test cannot pass by
    missing an import form."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    sources = {
        "__init__.py": "from pkg.a import A\n",
        "a.py": "A = 1\ndef f():\n    import pkg.b          # lazy, still an edge\n",
        "b.py": "from pkg.sub import c, Name\n",                # module c and pkg.sub for Name
        "sub/__init__.py": "Name = 2\n",
        "sub/c.py": "from .. import d\nfrom .e import X\n",   # relative: pkg.d, pkg.sub.e
        "sub/e.py": "X = 3\nimport os\n",                    # not ours: no edge
        "d.py": "from pkg.a import A\n",                      # closes pkg.a -> b -> c -> d -> a
    }
    for name, text in sources.items():
        (pkg / name).write_text(text)
    graph = {m: set(edges) for m, edges in import_graph(pkg).items()}
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.sub.c", "pkg.sub"},
        "pkg.sub": set(),
        "pkg.sub.c": {"pkg.d", "pkg.sub.e"},
        "pkg.sub.e": set(),
        "pkg.d": {"pkg.a"},
    }
    found = cycles(import_graph(pkg))
    assert found == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.d", "pkg.a"]]


def test_packages_can_cycle_where_modules_do_not(tmp_path):
    """pkg.a.x -> pkg.b.y -> pkg.top -> pkg.a.z: no module is on a cycle, yet packages a and b
    and the top-level module top need each other, and the package graph says so."""
    pkg = tmp_path / "pkg"
    sources = {"__init__.py": "", "a/__init__.py": "", "b/__init__.py": "",
               "a/x.py": "import pkg.b.y\n", "a/z.py": "Z = 1\n",
               "b/y.py": "from pkg import top\n", "top.py": "from pkg.a import z\n"}
    for name, text in sources.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    graph = import_graph(pkg)
    assert cycles(graph) == []
    packages = package_graph(graph)
    assert {p: set(edges) for p, edges in packages.items()} == {
        "pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.top"}, "pkg.top": {"pkg.a"}}
    assert packages["pkg.b"]["pkg.top"] == ("pkg.b.y", 1)
    assert cycles(packages) == [["pkg.a", "pkg.b", "pkg.top", "pkg.a"]]


def test_the_runner_and_the_sampler_read_messages_not_core_requests():
    """V1's border (issue 62): what worker/ and sample/ know of a request came in a message
    (core/scheduler_output.py, by request id); the core's Request, V0's scheduler (core/v0/)
    and the grammars' matchers (structured_output/: the worker gets a bitmask) stay on the
    core's side."""
    graph = import_graph(REPO / "minivllm")
    crossing = {module: sorted(e for e in edges if e == "minivllm.core.request"
                               or e.startswith(("minivllm.core.v0",
                                                "minivllm.structured_output")))
                for module, edges in graph.items()
                if module.startswith(("minivllm.worker", "minivllm.sample"))}
    assert "minivllm.core.scheduler_output" in graph["minivllm.worker.model_runner"]
    assert not any(crossing.values()), {m: e for m, e in crossing.items() if e}
