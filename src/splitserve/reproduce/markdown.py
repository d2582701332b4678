"""The report document: markdown lines and tables, and the notes that explain each difference of
more than 10% from the paper."""

from __future__ import annotations

from pathlib import Path


def ratio_cell(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}" if theirs else "-"


def table_row(cells: list) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


class Report:
    def __init__(self, out: Path):
        self.out = out
        self.lines: list[str] = []
        self._why: dict[str, list[str]] = {}

    def add(self, *lines: str) -> None:
        self.flush()
        self.lines.extend(lines)

    def table(self, header: list[str], rows: list[list]) -> None:
        self.add(table_row(header), table_row(["---"] * len(header)), *(table_row(r) for r in rows), "")

    def explain(self, what: str, ours: float, theirs: float, why: str) -> None:
        """Note a difference of more than 10% from the paper; one sentence per reason."""
        if theirs and abs(ours / theirs - 1) > 0.10:
            self._why.setdefault(why, []).append(f"{what} ({ours / theirs:.2f}x)")

    def flush(self) -> None:
        why, self._why = self._why, {}
        for reason, items in why.items():
            self.lines.append(f"- {', '.join(items)}: {reason}")
        if why:
            self.lines.append("")

    def write(self) -> Path:
        self.flush()
        path = self.out / "report.md"
        path.write_text("\n".join(self.lines) + "\n")
        return path
