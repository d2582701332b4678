import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))   # fake_server, the test double of the real server

import gc

import pytest


@pytest.fixture(autouse=True)
def frozen_heap():
    """These tests time the client to milliseconds, in the pytest process, which by then holds the
    whole suite's heap (torch and every test module): a full garbage collection of it took 37-165 ms
    on the 2-core dev VM (measured with a gc callback), and one landing mid-run shifts every request
    in flight. `splitserve bench` runs in its own small process. Freezing the heap that exists before
    the test keeps those collections to the objects the test itself makes."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()
