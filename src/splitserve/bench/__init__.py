"""`splitserve bench`: open-loop trace replay against a live OpenAI-compatible server.

The requests are the simulator's: `make_workload` with the same seed gives the same arrival times
and sizes, so a live run and a simulated run of one workload are comparable metric for metric
(both write `summary.json` with the same names, docs/architecture.md, "summary.json").

Modules: `plan` (workload -> capped request sizes and token-id prompts), `sse` (the streaming
completions wire format), `client` (the open-loop sender and the per-request measurement),
`summary` (summary.json), `table` (the terminal table), `run` (validation and the whole run),
`cli` (the typer command, cheap to import). Entry point for code: `bench.run.run_bench`.
"""
