"""The shape of the package, checked: no import cycle, counting imports made inside functions (a
function-level import is no way around one); lower layers never import higher ones; functions of at
most 60 lines (the typer commands of cli/, which declare their options, excepted); classes of at
most 15 methods and at most one base that is not a builtin, typing, enum or abc base (no mixins);
no underscore-private name imported across modules; no caller branches on a scheduler's name or
probes a scheduler for a hook.

The KNOWN_* lists hold what breaks a rule today, each with its size then: they may only shrink. A
new offender, or a listed one grown, fails `test_no_new_offenders`; a listed one that shrank or
went fails `test_the_known_lists_are_current` until its entry is lowered or removed.
"""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "splitserve"
MAX_FUNCTION_LINES = 60
MAX_METHODS = 15
# bases that make no mixin: builtins (str, int, the exceptions), and these (typing, enum, abc)
PLAIN_BASES = {*dir(builtins), "Protocol", "Generic", "Enum", "IntEnum", "StrEnum", "Flag", "IntFlag",
               "NamedTuple", "TypedDict", "ABC"}

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


# What breaks a rule today (size then); they may only shrink. {"path in the package:qualified name": size}
KNOWN_LONG_FUNCTIONS = {
}
KNOWN_BIG_CLASSES = {
}
KNOWN_MIXINS = {            # the class: how many of its bases are not plain ones
}
KNOWN_PRIVATE_IMPORTS = {   # the module: the private names it imports from others
}


def is_typer_command(f: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "command"
               for d in f.decorator_list)


def base_name(base: ast.expr) -> str:
    """`typing.Generic[T]` -> Generic."""
    if isinstance(base, ast.Subscript):
        base = base.value
    return base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", ast.unparse(base))


def definitions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function and class, nested ones as outer.inner."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield prefix + node.name, node
            yield from definitions(node, f"{prefix}{node.name}.")
        else:
            yield from definitions(node, prefix)


def shape(tree: ast.AST, path: str) -> dict[str, dict]:
    """What in one module (`path` inside the package) breaks each rule, with its size."""
    out: dict[str, dict] = {"long": {}, "big": {}, "mixins": {}, "private": {}}
    for name, node in definitions(tree):
        key = f"{path}:{name}"
        if isinstance(node, ast.ClassDef):
            methods = sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in node.body)
            mixed = sum(base_name(b) not in PLAIN_BASES for b in node.bases)
            if methods > MAX_METHODS:
                out["big"][key] = methods
            if mixed > 1:
                out["mixins"][key] = mixed
        elif (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES and not (
                path.startswith("cli/") and is_typer_command(node)):
            out["long"][key] = n
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("splitserve")):
            private = {a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")}
            if private:
                out["private"].setdefault(path, set()).update(private)
    return out


def package_shape() -> dict[str, dict]:
    out: dict[str, dict] = {"long": {}, "big": {}, "mixins": {}, "private": {}}
    for path, _ in modules().values():
        for rule, found in shape(ast.parse(path.read_text()), str(path.relative_to(PKG))).items():
            out[rule].update(found)
    return out


KNOWN = {"long": KNOWN_LONG_FUNCTIONS, "big": KNOWN_BIG_CLASSES, "mixins": KNOWN_MIXINS,
         "private": KNOWN_PRIVATE_IMPORTS}


def over(found: dict, known: dict) -> dict:
    """What is new or grew: a size above the known one, or private names not listed."""
    if all(isinstance(v, set) for v in found.values()):
        return {k: sorted(v - known.get(k, set())) for k, v in found.items() if v - known.get(k, set())}
    return {k: v for k, v in found.items() if v > known.get(k, 0)}


def test_the_checker_finds_each_kind_of_offender():
    long_body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    text = ("from .a import _hidden, shown, __version__\nclass Mixed(A, B, Protocol): pass\n"
            "class Fine(Base, Exception, Generic[T]): pass\n"
            "class Big:\n" + "".join(f"    def m{i}(self): pass\n" for i in range(MAX_METHODS + 1)) +
            f"def long():\n{long_body}\ndef short():\n    pass\n@app.command()\ndef command():\n{long_body}\n")
    assert shape(ast.parse(text), "sim/x.py") == {
        "long": {"sim/x.py:long": MAX_FUNCTION_LINES + 1, "sim/x.py:command": MAX_FUNCTION_LINES + 1},
        "big": {"sim/x.py:Big": MAX_METHODS + 1}, "mixins": {"sim/x.py:Mixed": 2},
        "private": {"sim/x.py": {"_hidden"}}}
    assert "cli/x.py:command" not in shape(ast.parse(text), "cli/x.py")["long"]
    assert over({"f": 61, "g": 70}, {"f": 65}) == {"g": 70}
    assert over({"m.py": {"_a", "_b"}}, {"m.py": {"_a"}}) == {"m.py": ["_b"]}


@pytest.mark.parametrize("rule", sorted(KNOWN))
def test_no_new_offenders(rule):
    assert over(package_shape()[rule], KNOWN[rule]) == {}


@pytest.mark.parametrize("rule", sorted(KNOWN))
def test_the_known_lists_are_current(rule):
    """A listed offender that shrank or went: lower or remove its entry (the lists only shrink)."""
    found = package_shape()[rule]
    stale = {k: (v, found.get(k)) for k, v in KNOWN[rule].items() if found.get(k) != v}
    assert stale == {}, f"KNOWN entries to lower or remove, (listed, now): {stale}"


def test_no_caller_branches_on_a_scheduler_name_or_probes_for_a_hook():
    pattern = re.compile(r'== "ecoserve"|getattr\(self\.cls|getattr\(self\.cluster\.cls|getattr\(sim\.cls')
    hits = [f"{p.relative_to(SRC)}:{i}" for p, _ in modules().values()
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []
