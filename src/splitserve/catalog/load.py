"""The catalog as a value (`Catalog`): the built-in files read once per process, a user
directory's files on top, each entry checked by checks.py; lookups by name."""

from __future__ import annotations

import hashlib
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from splitserve.errors import UserError

from .checks import Where, design_entry, hardware_entry, link_fits, model_entry, overhead_entries
from .design import Design
from .hardware import HardwareSpec
from .model import ModelSpec

FILES = ("hardware.toml", "models.toml", "designs.toml", "kv_transfer.toml")


@dataclass(frozen=True, eq=False)
class Catalog:
    """Hardware, models, designs and KV-transfer overheads by name: the built-in ones, and a user
    directory's on top (`load_catalog`). A plain picklable value, passed down to what looks names
    up; two catalogs are equal when they come from the same files (`fingerprint`)."""

    hardware: dict[str, HardwareSpec]
    models: dict[str, ModelSpec]
    designs: dict[str, Design]
    kv_overhead_s: dict[str, float]
    source: str = ""              # the user directory ("" = built-in only)
    fingerprint: str = ""         # sha256 of the user files read, by name ("" = built-in only)
    replaced: tuple[str, ...] = ()  # "FILE [NAME]" of each user entry that replaced a built-in one

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Catalog) and (self.source, self.fingerprint) == (other.source, other.fingerprint)

    def __hash__(self) -> int:
        return hash((self.source, self.fingerprint))

    def note(self) -> dict:
        """What a run's output says of this catalog (summary.json, provision.json, results.json)."""
        return {"source": self.source, "fingerprint": self.fingerprint, "replaced": list(self.replaced)}

    def hardware_spec(self, name: str) -> HardwareSpec:
        if name not in self.hardware:
            raise UserError(f"unknown hardware {name!r}; valid names: {', '.join(sorted(self.hardware))}")
        return self.hardware[name]

    def model(self, name: str) -> ModelSpec:
        if name not in self.models:
            raise UserError(f"unknown model {name!r}; valid names: {', '.join(sorted(self.models))}")
        return self.models[name]

    def design(self, name: str) -> Design:
        if name not in self.designs:
            raise UserError(f"unknown design {name!r}; choose one of: {', '.join(sorted(self.designs))}")
        return self.designs[name]


def _parse(tables: dict[str, tuple[Where, dict[str, Any]]], *, base: Catalog | None = None
           ) -> tuple[dict, dict, dict, dict, list[str], dict[str, Where]]:
    """Every entry of the files read (file name -> (where, parsed TOML)) checked, over `base`'s."""
    hw = dict(base.hardware) if base else {}
    models = dict(base.models) if base else {}
    designs = dict(base.designs) if base else {}
    overheads = dict(base.kv_overhead_s) if base else {}
    replaced: list[str] = []
    hw_where: dict[str, Where] = {}

    def merge(file: str, into: dict, entry: Callable[[Where, str, Any], Any]) -> None:
        if file not in tables:
            return
        where, raw = tables[file]
        for name, t in raw.items():
            if name in into:
                replaced.append(f"{where.file} [{name}]")
            into[name] = entry(where, name, t)
            if into is hw:
                hw_where[name] = where

    merge("hardware.toml", hw, hardware_entry)
    merge("models.toml", models, model_entry)
    merge("designs.toml", designs, lambda where, name, t: design_entry(where, name, t, hw))
    if "kv_transfer.toml" in tables:
        where, raw = tables["kv_transfer.toml"]
        for name, v in overhead_entries(where, raw, hw).items():
            if name in overheads:
                replaced.append(f"{where.file} [overhead_s] {name}")
            overheads[name] = v
    return hw, models, designs, overheads, replaced, hw_where


@lru_cache(maxsize=1)
def builtin_catalog() -> Catalog:
    """The package's own catalog (read once per process)."""
    tables = {}
    for f in FILES:
        with resources.files("splitserve.catalog").joinpath(f).open("rb") as fh:
            tables[f] = (Where(f"splitserve/catalog/{f}"), tomllib.load(fh))
    hw, models, designs, overheads, _, hw_where = _parse(tables)
    return Catalog(link_fits(hw_where, hw), models, designs, overheads)


def load_catalog(directory: str | os.PathLike[str] | None = None) -> Catalog:
    """The built-in catalog, with a user directory's files on top: any of hardware.toml,
    models.toml, designs.toml, kv_transfer.toml, in the built-in files' format. A user entry is
    added, or replaces the built-in entry of the same name (listed in `replaced`); each is checked
    as the built-in ones are. UserError names the file, the entry and the field."""
    base = builtin_catalog()
    if directory is None:
        return base
    root = Path(directory)
    if not root.is_dir():
        raise UserError(f"catalog {root}: not a directory")
    unknown = sorted(p.name for p in root.glob("*.toml") if p.name not in FILES)
    if unknown:
        raise UserError(f"catalog {root}: unknown file {', '.join(unknown)} (a catalog holds {', '.join(FILES)})")
    tables, digest = {}, hashlib.sha256()
    for f in FILES:
        path = root / f
        if not path.is_file():
            continue
        data = path.read_bytes()
        digest.update(f.encode() + b"\0" + data + b"\0")
        try:
            tables[f] = (Where(str(path)), tomllib.loads(data.decode("utf-8")))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"catalog {path}: not valid TOML: {e}") from None
    if not tables:
        raise UserError(f"catalog {root}: holds none of {', '.join(FILES)}")
    hw, models, designs, overheads, replaced, hw_where = _parse(tables, base=base)
    base_where = {n: Where("splitserve/catalog/hardware.toml") for n in hw if n not in hw_where}
    hw = link_fits({**base_where, **hw_where}, {n: replace(s, roofline=replace(s.roofline, fitted_ref=None))
                                                  for n, s in hw.items()})
    return Catalog(hw, models, designs, overheads, source=str(root), fingerprint=digest.hexdigest(),
                   replaced=tuple(replaced))


def hardware_names(catalog: Catalog | None = None) -> list[str]:
    return sorted((catalog or builtin_catalog()).hardware)


def model_names(catalog: Catalog | None = None) -> list[str]:
    return sorted((catalog or builtin_catalog()).models)


def load_hardware(name: str, catalog: Catalog | None = None) -> HardwareSpec:
    return (catalog or builtin_catalog()).hardware_spec(name)


def load_model(name: str, catalog: Catalog | None = None) -> ModelSpec:
    return (catalog or builtin_catalog()).model(name)
