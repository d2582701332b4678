"""Declared dependencies match imports (issue 17, item 9).

Every `import` / `from ... import` in src/splitserve (read with `ast`, so lazy imports inside
functions count too) is mapped to its distribution with importlib.metadata.packages_distributions()
and must be declared where the importing code is installed from:

- engine/ (the `generate` command runs it)                      -> the `engine` extra
- serve/, bench/ (a client of `serve`), twin/ (profiles a live server) -> the `serve` extra
  (which pulls in `engine` through `splitserve[engine]`)
- `ray`, anywhere (provision/ and serve/ import it lazily, as an optional backend) -> the `ray` extra
- `triton`, anywhere (engine/'s optional CUDA kernels, imported only when chosen) -> the `triton` extra
- everything else (simulator, policies, provisioning, reports, cli/) -> `[project] dependencies`

A module may always use what the core declares. Conversely every declared dependency must be used:
imported somewhere in src/splitserve, or, for the two that uvicorn loads by name
(`--http-impl httptools`, `--loop-impl uvloop`), named as a string in serve/; the `test` extra's
must be imported, or named, by the tests.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "splitserve"

SUBPACKAGE_EXTRA = {"engine": "engine", "serve": "serve", "bench": "serve", "twin": "serve"}
MODULE_EXTRA = {"ray": "ray", "triton": "triton"}
LOADED_BY_NAME = {"httptools": "uvicorn's --http httptools", "uvloop": "uvicorn's --loop uvloop"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement(spec: str) -> tuple[str, list[str]]:
    """(normalised name, extras) of a PEP 508 requirement such as 'splitserve[engine]' or
    "uvloop>=0.19; sys_platform != 'win32'"."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", spec)
    assert m, spec
    extras = [e.strip() for e in (m.group(2) or "").split(",") if e.strip()]
    return _norm(m.group(1)), extras


def declared() -> tuple[set[str], dict[str, set[str]]]:
    """The core's distributions, and each extra's (self-references such as splitserve[engine]
    expanded)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    raw = {"": project["dependencies"], **project["optional-dependencies"]}

    def expand(extra: str, seen: frozenset = frozenset()) -> set[str]:
        out = set()
        for spec in raw[extra]:
            name, extras = _requirement(spec)
            if name == "splitserve":
                for e in extras:
                    if e not in seen:
                        out |= expand(e, seen | {e})
            else:
                out.add(name)
        return out

    return expand(""), {e: expand(e) for e in raw if e}


def direct(extra: str) -> set[str]:
    """What one section itself lists (no self-references)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] if extra == "" else project["optional-dependencies"][extra]
    return {n for n, _ in map(_requirement, specs) if n != "splitserve"}


def third_party_imports(root: Path, package: str | None) -> list[tuple[Path, int, str]]:
    """(file, line, top-level module) of every absolute import of a module that is neither in the
    standard library nor the project itself."""
    out = []
    for f in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in (package, "splitserve", "__future__", "tests"):
                    continue
                out.append((f, node.lineno, top))
    return out


def extra_of(path: Path, module: str) -> str:
    """The extra that must declare `module` when imported from `path` ('' for the core)."""
    if module in MODULE_EXTRA:
        return MODULE_EXTRA[module]
    return SUBPACKAGE_EXTRA.get(path.relative_to(SRC).parts[0], "")


@functools.cache
def _installed() -> dict[str, list[str]]:
    """Top-level module -> distributions, read once: a read scans every installed package's files
    (0.12 s with the test extra's 110 packages), and the walks below ask once per import (90 s of
    a CI run before this cache; 3 s now for this file)."""
    return packages_distributions()


def _distributions(module: str) -> set[str]:
    dists = _installed().get(module)
    if not dists and module in MODULE_EXTRA:  # an optional backend not installed here: its own name
        return {_norm(module)}
    assert dists, f"{module} is imported but no installed distribution provides it"
    return {_norm(d) for d in dists}


def test_requirement_parser():
    assert _requirement("splitserve[engine,serve, ray]") == ("splitserve", ["engine", "serve", "ray"])
    assert _requirement("uvloop>=0.19; sys_platform != 'win32'") == ("uvloop", [])
    assert _requirement("prometheus_client>=0.20") == ("prometheus-client", [])


def test_the_declared_sets():
    core, extras = declared()
    assert core == {"numpy", "typer", "rich", "matplotlib", "pyyaml"}  # pyyaml: YAML run configs
    assert "pydantic" not in core and {"pydantic", "jinja2", "starlette"} <= direct("serve")
    assert direct("engine") <= extras["serve"]            # serve pulls engine in
    assert {"pytest", "hypothesis", "ray", "torch", "fastapi"} <= extras["test"]


def test_every_import_is_declared_where_its_code_is_installed_from():
    core, extras = declared()
    imports = third_party_imports(SRC, "splitserve")
    assert len(imports) > 50                             # the walk found the code
    missing = []
    for path, line, module in imports:
        extra = extra_of(path, module)
        allowed = core | (extras[extra] if extra else set())
        if not _distributions(module) & allowed:
            missing.append(f"{path.relative_to(ROOT)}:{line}: {module} "
                           f"(declare {sorted(_distributions(module))} in {extra or 'dependencies'})")
    assert not missing, "\n".join(missing)


def test_every_declared_dependency_is_used():
    src_dists = set()
    for _, _, module in third_party_imports(SRC, "splitserve"):
        src_dists |= _distributions(module)
    serve_text = "\n".join(p.read_text() for p in (SRC / "serve").rglob("*.py"))
    for name, how in LOADED_BY_NAME.items():
        assert f'"{name}"' in serve_text, f"{name} is declared for {how}, but serve/ no longer names it"
    by_name = {_norm(n) for n in LOADED_BY_NAME}
    unused = []
    for section in ("", "engine", "serve", "ray", "triton"):
        for name in direct(section) - src_dists - by_name:
            unused.append(f"{name} ({section or 'dependencies'})")
    assert not unused, f"declared but never imported in src/splitserve: {', '.join(sorted(unused))}"

    test_dists = set()
    for _, _, module in third_party_imports(ROOT / "tests", None):
        if module in _installed():
            test_dists |= _distributions(module)
    tests_text = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))
    unused_test = [n for n in direct("test") - test_dists if n not in tests_text.lower()]
    assert not unused_test, f"test extra declares {unused_test}, which no test imports or runs"
