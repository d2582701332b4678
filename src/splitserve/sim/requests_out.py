"""`simulate --requests-out FILE`: one row per request, written as it completes (streamed through
the file's buffer, nothing kept per request), in completion order.

Columns: `id` (arrival order, from 0), `arrival_s`, `prompt_tokens`, `output_tokens`, `ttft_s`,
`tbt_mean_s` (its mean gap between tokens: (E2E - TTFT) / (output_tokens - 1); empty, or null,
for a one-token request), `e2e_s`, `prompt_machine` and `token_machine` (machine ids: the
cluster's machines pool by pool as summary.json lists them, prompt pool first; -1: none). Times in
seconds, to the microsecond; TTFT and E2E as the summary counts them (to the client, the front
end's overhead included). A `.csv` file has a header row; `.jsonl` (or `.ndjson`) one JSON object
a line.

Hooked on `Metrics.on_complete` (sim/metrics.py), which the simulator calls for each completed
request."""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import IO

from ..errors import UserError
from ..policy.state import Request

COLUMNS = ("id", "arrival_s", "prompt_tokens", "output_tokens", "ttft_s", "tbt_mean_s", "e2e_s",
           "prompt_machine", "token_machine")
BUFFER = 1 << 20


class RequestsOut:
    """The writer: call it with (request, TTFT, E2E) for each completed request; close at the end
    (or use it as a context manager). `rows` counts what it wrote."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        suffix = self.path.suffix.lower()
        if suffix not in (".csv", ".jsonl", ".ndjson"):
            raise UserError(f"--requests-out {path}: name a .csv or .jsonl file")
        self.jsonl = suffix != ".csv"
        try:
            self.file: IO[str] = self.path.open("w", buffering=BUFFER, newline="")
        except OSError as e:
            raise UserError(f"--requests-out {path}: cannot write it ({e.strerror})") from None
        self.rows = 0
        if not self.jsonl:
            self.file.write(",".join(COLUMNS) + "\n")

    def __call__(self, r: Request, ttft: float, e2e: float) -> None:
        self.rows += 1
        n = r.output_tokens
        if self.jsonl:
            tbt = "%.6f" % ((e2e - ttft) / (n - 1)) if n > 1 else "null"
            self.file.write('{"id":%d,"arrival_s":%.6f,"prompt_tokens":%d,"output_tokens":%d,"ttft_s":%.6f,'
                            '"tbt_mean_s":%s,"e2e_s":%.6f,"prompt_machine":%d,"token_machine":%d}\n'
                            % (r.id, r.arrival, r.prompt_tokens, n, ttft, tbt, e2e, r.prompt_machine,
                               r.token_machine))
        else:
            tbt = "%.6f" % ((e2e - ttft) / (n - 1)) if n > 1 else ""
            self.file.write("%d,%.6f,%d,%d,%.6f,%s,%.6f,%d,%d\n" % (r.id, r.arrival, r.prompt_tokens, n, ttft, tbt,
                                                                    e2e, r.prompt_machine, r.token_machine))

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> RequestsOut:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
