"""The kinds of event on the simulator's heap (sim/simulator.py): (time, seq, kind, object)."""

ARRIVAL, ITER_END, TRANSFER_END, STAGE_FREE, WATCH = 0, 1, 2, 3, 4
