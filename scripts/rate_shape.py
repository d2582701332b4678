"""Measured shapes of the request rate (workload/shape.py): the arrivals per time bin of Azure-format
trace CSVs (`TIMESTAMP,ContextTokens,GeneratedTokens`).

    python scripts/rate_shape.py [--traces ../shared/traces] [--bin 60]
        writes src/splitserve/workload/data/rate_shapes.json: `azure-code` and `azure-conv`, from
        the Azure LLM inference traces of 2023 (Microsoft, CC-BY 4.0) in ../shared/traces
    python scripts/rate_shape.py --trace FILE.csv --name NAME [--bin 1800] [--fold 86400] --out NAME.json
        one shape from any trace, for `--rate-profile NAME.json`

The 2023 traces cover about one hour each (2023-11-16, 18:15 to 19:14 on the trace's clock; the
code trace from 18:17), not a day: the built-in shapes are that hour's arrivals per minute, and a
run longer than the hour repeats it (workload/shape.py). No 24-hour shape can be derived from
them, and none ships. A trace that covers days gives one: `--fold 86400` adds up each
time-of-day bin over the days it covers (`counts`), divided by the seconds of trace in that bin
(`exposure_s`), so that the shape's time 0 is midnight on the trace's clock.

A shape holds the counts as measured; the package derives the relative rates from them (a bin's
rate over the mean of the bins' rates). Bins are whole: an unfolded trace's last partial bin is
left out (its requests too; `requests` counts those kept).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from datetime import datetime
from pathlib import Path

import numpy as np

from splitserve.workload.trace import load_trace

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "splitserve" / "workload" / "data" / "rate_shapes.json"
BUILT_IN = {"azure-code": "azure_2023_code.csv", "azure-conv": "azure_2023_conv.csv"}
ABOUT = ("Arrivals per bin of the Azure LLM inference traces of 2023 (Microsoft, CC-BY 4.0: "
         "AzureLLMInferenceTrace_code and _conv), made by `python scripts/rate_shape.py` from ../shared/traces. "
         "Each trace covers about one hour (2023-11-16, from 18:15 or 18:17 to 19:14 on the trace's clock), "
         "not a day: a run longer than a shape's period repeats it, and no diurnal (24-hour) shape "
         "is derived from these traces.")


def first_timestamp(path: Path) -> datetime:
    """The earliest TIMESTAMP of the trace as a naive date-time (7 fractional digits cut to 6)."""
    with path.open(newline="") as f:
        rows = csv.DictReader(f)
        stamps = [r["TIMESTAMP"].strip() for r in rows if r.get("TIMESTAMP")]
    head, _, frac = min(stamps).partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}" if frac else head)


def exposure(first_tod: float, span: float, bin_s: float, fold: float) -> np.ndarray:
    """Seconds of [first_tod, first_tod + span) that fall in each time-of-day bin of the fold."""
    n = int(round(fold / bin_s))
    folds = np.arange(int(first_tod // fold), int((first_tod + span) // fold) + 1)
    lo = folds[:, None] * fold + np.arange(n)[None, :] * bin_s
    over = np.minimum(lo + bin_s, first_tod + span) - np.maximum(lo, first_tod)
    return np.clip(over, 0.0, None).sum(axis=0)


def shape_of(path: Path, name: str, bin_s: float, fold: float | None) -> dict:
    """One shape entry of the data file (the module's docstring)."""
    tr = load_trace(path)
    start = first_timestamp(path)
    t, span = tr.arrival_s, tr.duration
    entry: dict = {"name": name, "trace": path.name, "first_request": start.isoformat(sep=" "),
                   "span_s": round(span, 3), "bin_s": bin_s}
    if fold is None:
        n = int(span // bin_s)
        if n < 1:
            raise SystemExit(f"{path}: spans {span:.0f} s, less than one bin of {bin_s:g} s")
        kept = t[t < n * bin_s]
        entry.update(requests=len(kept), counts=np.bincount((kept // bin_s).astype(int), minlength=n).tolist())
        return entry
    if abs(fold / bin_s - round(fold / bin_s)) > 1e-9:
        raise SystemExit(f"--bin {bin_s:g} must divide --fold {fold:g}")
    tod0 = start.hour * 3600 + start.minute * 60 + start.second + start.microsecond / 1e6
    exp = exposure(tod0, span, bin_s, fold)
    if not np.all(exp > 0):
        raise SystemExit(f"{path}: spans {span:.0f} s and leaves bins of the {fold:g} s fold uncovered")
    counts = np.bincount((((tod0 + t) % fold) // bin_s).astype(int), minlength=len(exp))
    entry.update(fold_s=fold, requests=len(t), counts=counts.tolist(), exposure_s=[round(float(x), 3) for x in exp])
    return entry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", default=str(ROOT.parent / "shared" / "traces"),
                    help="folder of the Azure 2023 traces (the built-in shapes)")
    ap.add_argument("--trace", help="one trace CSV: write its shape to --out instead of the built-in ones")
    ap.add_argument("--name", help="the shape's name (with --trace; default the file's stem)")
    ap.add_argument("--bin", type=float, default=60.0, help="bin width, seconds (default 60)")
    ap.add_argument("--fold", type=float, help="fold a trace of days onto one period, e.g. 86400 (with --trace)")
    ap.add_argument("--out", type=Path, help="the shape file to write (with --trace)")
    a = ap.parse_args()
    if a.trace:
        if a.out is None:
            raise SystemExit("--trace needs --out")
        path = Path(a.trace)
        entry = shape_of(path, a.name or path.stem, a.bin, a.fold)
        doc = {"about": f"made by `python scripts/rate_shape.py --trace {path.name}` (bin {a.bin:g} s"
                        + (f", folded on {a.fold:g} s" if a.fold else "") + ")", "shapes": [entry]}
        out = a.out
    else:
        if a.fold:
            raise SystemExit("--fold goes with --trace: the built-in traces cover one hour")
        doc = {"about": ABOUT, "shapes": [shape_of(Path(a.traces) / f, n, a.bin, None) for n, f in BUILT_IN.items()]}
        out = OUT
    text = json.dumps(doc, indent=1)   # each list of numbers on one line
    out.write_text(re.sub(r"\[\s+([-0-9.,\s]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text) + "\n")
    for e in doc["shapes"]:
        c = np.asarray(e["counts"], dtype=float)
        rate = c / np.asarray(e.get("exposure_s", [e["bin_s"]] * len(c)))
        print(f"{e['name']}: {e['requests']} requests from {e['first_request']}, {len(c)} bins of {e['bin_s']:g} s; "
              f"busiest bin {rate.max() / rate.mean():.2f}x the mean, quietest {rate.min() / rate.mean():.2f}x")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
