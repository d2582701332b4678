"""`splitserve compare`: every serving system of policy/systems.py on one workload, model, kind of
machine and machine budget; each system's goodput, what it costs, its latencies, and its paper's
headline claim beside what the simulation finds."""
