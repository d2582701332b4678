"""Live phase-split serving: `splitserve serve`.

    api.py            FastAPI front end (OpenAI-compatible completions / chat, /metrics, /health)
    openai_io.py      request validation, error bodies, chat template, detokenization
    router.py         admission, policy routing, worker liveness, request restarts
    cluster_state.py  the simulator's policy objects kept in step with the live workers
    worker.py         a worker process: one engine, prompt / token / mixed work
    transfer.py       KV transports (TCP; CUDA IPC and NCCL are stubs) and both transfer ends
    protocol.py       signed msgpack messages over ZeroMQ (the cluster secret)
    launcher.py       local processes or Ray actors
    echo.py           benchmark-only engine stand-in (--worker-mode echo)
    cli.py            the `serve` command

Importing this package imports nothing heavy; fastapi / torch come with the modules that need them.
"""
