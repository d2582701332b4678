"""What identifies this splitserve: a hash of its installed source and data files. Provisioning's
cache keys its simulations by it (provision/evaluate.py), and every Ray node must show the same
(nodes/ray_cluster.py `check_nodes`)."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import resources
from pathlib import Path


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Hash of every source and data file of the installed package."""
    h = hashlib.sha256()
    root = resources.files("splitserve")
    for path in sorted(Path(str(root)).rglob("*")):
        if path.suffix in (".py", ".toml", ".json") and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(str(root))).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]
