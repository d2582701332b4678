"""Hardware, model and design specs, kept as data in `hardware.toml`, `models.toml`,
`designs.toml` and `kv_transfer.toml`, and a user's own files of the same names on top.

    load_catalog("my-catalog/")  -> Catalog (the built-in entries, the directory's added or replacing)
    load_hardware("dgx-h100")  -> HardwareSpec (one 8-GPU machine, tensor parallel inside it)
    load_model("llama2-70b")   -> ModelSpec
    kv_capacity_tokens(model, hw)  -> tokens of KV cache one machine holds

Every entry, built-in or a user's, goes through the same checks (checks.py): each field present,
of its type, in its range; a UserError names the file, the entry and the field.
`load_hardware(name, catalog)` and the like look a name up in the catalog given, or in the
built-in one (read once per process).

The modules, one idea each: hardware.py (HardwareSpec, RooflineCalibration), model.py
(ModelSpec), design.py (Design), checks.py (the checks of an entry), load.py (the Catalog value,
reading the files, lookups by name), capacity.py (KV capacity and the activation reserve).
The catalog is the bottom layer: it imports nothing of splitserve but errors.py.

Units: bytes, seconds, watts unless a field name says otherwise (`hbm_gb` is 1e9 bytes,
`hbm_bw_gbs` is 1e9 bytes/s, `bf16_tflops` is 1e12 FLOP/s, `power_kw` is kilowatts).
"""

from __future__ import annotations

from .capacity import activation_reserve_bytes, kv_capacity_tokens
from .design import Design
from .hardware import HardwareSpec, RooflineCalibration
from .load import (
    Catalog,
    builtin_catalog,
    hardware_names,
    load_catalog,
    load_hardware,
    load_model,
    model_names,
)
from .model import ModelSpec

__all__ = [
    "Catalog",
    "Design",
    "HardwareSpec",
    "ModelSpec",
    "RooflineCalibration",
    "activation_reserve_bytes",
    "hardware_names",
    "kv_capacity_tokens",
    "builtin_catalog",
    "load_catalog",
    "load_hardware",
    "load_model",
    "model_names",
]
