"""Azure LLM inference trace CSVs (`TIMESTAMP,ContextTokens,GeneratedTokens`), read as is."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from ..errors import UserError

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True, slots=True)
class Trace:
    arrival_s: np.ndarray        # float64, seconds after the first request, non-decreasing
    prompt_tokens: np.ndarray    # int64, >= 1
    output_tokens: np.ndarray    # int64, >= 1

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration(self) -> float:
        return float(self.arrival_s[-1]) if len(self) else 0.0


def _timestamp(text: str) -> float:
    """Seconds: either a number, or a date-time like `2023-11-16 18:17:03.9799600` (the Azure
    files carry 7 fractional digits, one more than datetime parses)."""
    try:
        return float(text)
    except ValueError:
        pass
    head, dot, frac = text.strip().partition(".")
    t = datetime.fromisoformat(head).timestamp()
    if dot:
        if not frac.isdigit():
            raise ValueError(text)
        t += int(frac) / 10 ** len(frac)
    return t


def load_trace(path: str | Path) -> Trace:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"trace file {path} not found")
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise UserError(f"{path}: empty file; expected a header {','.join(COLUMNS)}")
        names = [h.strip() for h in header]
        missing = [c for c in COLUMNS if c not in names]
        if missing:
            raise UserError(f"{path}: missing column(s) {', '.join(missing)}; expected a header "
                            f"{','.join(COLUMNS)}, got {','.join(names)}")
        it, ip, io = (names.index(c) for c in COLUMNS)
        for line, row in enumerate(reader, start=2):
            if not row or all(not c.strip() for c in row):
                continue
            try:
                ts, p, o = row[it], row[ip], row[io]
            except IndexError:
                raise UserError(f"{path}, line {line}: expected {len(names)} fields, got {len(row)}") from None
            try:
                t = _timestamp(ts)
            except ValueError:
                raise UserError(f"{path}, line {line}: cannot read timestamp {ts!r}") from None
            try:
                pi, oi = int(p), int(o)
            except ValueError:
                raise UserError(f"{path}, line {line}: token counts must be integers, got "
                                f"ContextTokens={p!r}, GeneratedTokens={o!r}") from None
            if pi <= 0 or oi <= 0:
                raise UserError(f"{path}, line {line}: token counts must be positive, got "
                                f"ContextTokens={pi}, GeneratedTokens={oi}")
            times.append(t)
            prompts.append(pi)
            outputs.append(oi)
    if not times:
        raise UserError(f"{path}: the trace has no requests")
    stamps = np.asarray(times, dtype=np.float64)
    order = np.argsort(stamps, kind="stable")
    stamps = stamps[order] - stamps[order[0]]
    return Trace(stamps, np.asarray(prompts, dtype=np.int64)[order], np.asarray(outputs, dtype=np.int64)[order])
