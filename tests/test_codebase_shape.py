"""The shape of the package, checked (issue 25): no import cycle, counting imports made inside
functions (a function-level import is no way around one); lower layers never import higher ones;
no module over 300 lines; no caller branches on a scheduler's name or probes a scheduler for a hook.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "splitserve"
MAX_LINES = 300

# package -> packages it must never import (the layering of docs/architecture.md)
LAYERS = {
    "policy": ("sim", "serve", "engine", "provision", "reproduce", "compare", "bench", "twin", "cli"),
    "perf": ("sim", "serve", "engine", "provision", "reproduce", "compare", "bench", "twin", "cli"),
    "catalog": ("sim", "serve", "engine", "provision", "reproduce", "compare", "bench", "twin", "cli", "policy"),
    "workload": ("sim", "serve", "engine", "provision", "reproduce", "compare", "bench", "twin", "cli"),
    "engine": ("serve", "sim", "provision", "reproduce", "compare", "bench", "cli"),
    "sim": ("serve", "provision", "reproduce", "compare", "bench", "cli"),
    "provision": ("reproduce", "compare", "cli"),
}


def modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        out[".".join(parts)] = (p, is_pkg)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the splitserve modules it imports anywhere in its text (top level or in a function).
    A package's own __init__ run by importing one of its modules is not counted."""
    mods = modules()

    def resolve(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for name, (path, is_pkg) in mods.items():
        pkg = name if is_pkg else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(resolve(a.name) for a in node.names if a.name.startswith("splitserve"))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    full = ".".join(base + ([node.module] if node.module else []))
                else:
                    full = node.module or ""
                if full.startswith("splitserve"):
                    for a in node.names:
                        sub = f"{full}.{a.name}"
                        deps.add(sub if sub in mods else resolve(full))
        deps.discard(name)
        deps.discard("")
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_the_checker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


@pytest.mark.parametrize("low", sorted(LAYERS))
def test_lower_layers_never_import_higher_ones(low):
    bad = sorted(f"{m} imports {d}" for m, deps in import_graph().items()
                 if m.split(".")[1:2] == [low] for d in deps
                 if d.split(".")[1:2] and d.split(".")[1] in LAYERS[low])
    assert bad == []


def test_no_module_over_300_lines():
    big = {str(p.relative_to(SRC)): n for p, _ in modules().values()
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}


def test_no_caller_branches_on_a_scheduler_name_or_probes_for_a_hook():
    pattern = re.compile(r'== "ecoserve"|getattr\(self\.cls|getattr\(self\.cluster\.cls|getattr\(sim\.cls')
    hits = [f"{p.relative_to(SRC)}:{i}" for p, _ in modules().values()
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []
