"""README.md reads in five minutes and points at everything else: at most 15,000 characters, a
quick start of exactly the two commands that .ci/run runs, every top-level docs/*.md page linked
from it, and every relative link in README.md and docs/*.md pointing at a file that exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def links(path: Path) -> list[str]:
    """The targets of a markdown file's [text](target) links, outside fenced code blocks."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return LINK.findall(text)


def relative(target: str) -> bool:
    return not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")


def test_readme_is_short():
    n = len(README.read_text())
    assert n <= 15_000, f"README.md has {n:,} characters; move detail into docs/"


def test_quick_start_is_the_two_commands_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    (awk,) = re.findall(r"(awk '[^']*' README\.md)", ci)  # the very extraction .ci/run does
    out = subprocess.run(["bash", "-c", awk], cwd=ROOT, capture_output=True, text=True, check=True)
    cmds = out.stdout.splitlines()
    assert len(cmds) == 2, cmds
    assert cmds[0] == "pip install . && splitserve simulate"
    assert re.fullmatch(r"pip install torch==[\d.]+ '\.\[test\]' && python -m pytest", cmds[1]), cmds[1]


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.split("#")[0]).resolve() for t in links(README) if relative(t)}
    pages = sorted(DOCS.glob("*.md"))
    assert pages
    missing = [p.name for p in pages if p.resolve() not in linked]
    assert not missing, f"docs pages not linked from README.md: {missing}"


def test_every_relative_link_points_at_a_file():
    broken = []
    for md in [README, *sorted(DOCS.glob("*.md"))]:
        for target in links(md):
            path = target.split("#")[0]
            if relative(target) and path and not (md.parent / path).exists():
                broken.append(f"{md.relative_to(ROOT)}: {target}")
    assert not broken, broken
