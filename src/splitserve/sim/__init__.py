"""The discrete-event simulator (simulator.py) and what surrounds it."""


def compiled() -> bool:
    """Whether the simulator's hot path (setup.py HOT) runs compiled with mypyc, not as Python."""
    from . import simulator

    return not simulator.__file__.endswith(".py")
