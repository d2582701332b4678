"""Live phase-split serving: `splitserve serve`.

    api.py            FastAPI front end (OpenAI-compatible completions / chat, /metrics, /health)
    schema.py         request checks: every field checked by type, range and size (bodies.py: the typed
                      models; refusals.py: what is not implemented; prompts.py: prompt to token ids)
    openai_io.py      JSON and error bodies, the served model's facts, chat templates
    detokenize.py     incremental detokenization and stop strings
    router.py         admission and lifecycle; owns its parts (request_flow.py: routing and delivery;
                      recovery.py: restarts; reports.py: worker messages, quarantine)
    supervisor.py     worker processes: start, watch, replace with back-off; /health's view
    cluster_state.py  the simulator's policy objects kept in step with the live workers
    worker.py         a worker process: one engine, prompt / token / mixed work
    kv/               KV transfer: transports (tcp; local: shared memory / CUDA IPC), the prompt side
                      (sender) and token side (receiver) of the engine's KV connector
    shm.py            a KV cache in memory that same-host peers map (--transport local)
    protocol.py       signed msgpack messages over ZeroMQ: identities, replay protection, size limits
    launcher.py       local processes or Ray actors
    echo.py           benchmark-only engine stand-in (--worker-mode echo)
    server.py         uvicorn with a drain on shutdown

The `serve` command is cli/serve.py. Importing this package imports nothing heavy; fastapi / torch come with the modules that need them.
"""
