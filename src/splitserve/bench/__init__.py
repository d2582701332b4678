"""`splitserve bench`: open-loop trace replay against a live OpenAI-compatible server.

The requests are the simulator's: `make_workload` with the same seed gives the same arrival times
and sizes, so a live run and a simulated run of one workload are comparable metric for metric
(both write `summary.json` with the same names, docs/architecture.md, "summary.json").

Besides the workloads, it speaks `vllm bench serve`'s terms: the chat endpoint, text prompts,
random and ShareGPT datasets, `--burstiness`, `--max-concurrency`, `--goodput`, `--percentiles`,
TPOT and token throughput, vLLM's millisecond names in summary.json.

Modules: `plan` (workload -> capped request sizes and token-id prompts), `arrivals` (gamma
arrivals), `datasets` (random sizes, the ShareGPT reader), `prompts` (exact-length text prompts
via the server's tokenizer), `sse` (the streaming wire format), `client` (the open-loop sender and
the per-request measurement), `metrics` (TPOT, goodput, percentiles), `summary` (summary.json),
`table` (the terminal table), `options` (the options and their checks), `server_check` (the
server's models and context, asked first), `planning` (each source's plan), `run` (the whole
run). The command: splitserve/cli/bench.py. Entry point for code: `bench.run.run_bench`.
"""
