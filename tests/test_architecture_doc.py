"""docs/architecture.md stays true to the code: every row of its "Where is rule X" index names a
file that exists and functions defined in that file, every module of the "Where things are"
table exists, and the code under src/ cites no design file outside the repository."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()
SRC = ROOT / "src" / "splitserve"


def section(title: str) -> str:
    return DOC.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def rows(text: str) -> list[list[str]]:
    """The body rows of every table in `text` (a header is the line above a `|---` line)."""
    lines = text.splitlines()
    return [[c.strip() for c in line.strip("|").split("|")] for i, line in enumerate(lines)
            if line.startswith("|") and not line.startswith("|---")
            and not (i + 1 < len(lines) and lines[i + 1].startswith("|---"))]


def defined_names(path: Path) -> set[str]:
    """Functions, classes, and Class.method names defined in a module."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
            names |= {f"{node.name}.{f.name}" for f in node.body
                      if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
    return names


def test_the_rule_index_points_at_code_that_exists():
    index = rows(section("Where is rule X"))
    assert len(index) >= 20
    for rule, file, funcs in index:
        path = SRC / file.split(" ")[0]
        assert path.is_file(), f"{rule!r}: no file {file}"
        names = defined_names(path)
        for name in re.findall(r"`([^`]+)`", funcs):
            assert name in names, f"{rule!r}: {name} is not defined in {file}"


def module_paths(cell: str) -> list[str]:
    """The modules a cell of the module table names: `a.py`, and `kv/` (`b.py`, `c.py`) for
    kv/, kv/b.py and kv/c.py."""
    paths = []
    for sub, inner in re.findall(r"`([^`]+/)`\s*\(([^)]*)\)", cell):
        paths += [sub] + [sub + n for n in re.findall(r"`([^`]+)`", inner)]
    rest = re.sub(r"`[^`]+/`\s*\([^)]*\)", "", cell)
    return paths + re.findall(r"`([^`]+)`", rest)


def test_the_module_table_names_modules_that_exist():
    package, seen = "", 0
    for pkg, modules, _job in rows(section("Where things are")):
        package = pkg or package
        for name in module_paths(modules):
            seen += 1
            assert (SRC / package / name).exists(), f"docs/architecture.md names {package}/{name}, which does not exist"
    assert seen >= 30


def test_code_cites_no_design_file_outside_the_repository():
    for path in SRC.rglob("*.py"):
        assert "DESIGN.md" not in path.read_text(), f"{path} cites DESIGN.md; cite docs/architecture.md"
