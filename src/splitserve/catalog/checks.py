"""The checks every catalog entry goes through, built-in or a user's: each field present, of its
type, in its range; a UserError names the file, the entry and the field (`Where`).

    hardware_entry(where, name, table)  -> HardwareSpec (its roofline checked with it)
    model_entry(where, name, table)     -> ModelSpec
    design_entry(where, name, table, hardware) -> Design (naming known machines)
    overhead_entries(where, raw, hardware) -> {hardware name: KV-transfer overhead, s}
    link_fits(where, hardware)          -> hardware, each `fitted_on` machine attached
"""

from __future__ import annotations

from dataclasses import Field, fields, replace
from typing import Any

from splitserve.errors import UserError

from .design import Design
from .hardware import HardwareSpec, RooflineCalibration
from .model import ModelSpec


class Where:
    """Names what an error is about: the file, the entry, the field."""

    def __init__(self, file: str):
        self.file = file

    def fail(self, entry: str | None, field: str | None, problem: str) -> UserError:
        at = "".join((f" [{entry}]" if entry is not None else "", f" {field}" if field else ""))
        return UserError(f"catalog {self.file}:{at}: {problem}")


_KIND = {"int": "an integer", "float": "a number", "str": "a string", "str | None": "a string"}


def _annotation(f: Field) -> str:
    """A field's annotation as written: the catalog's classes are under `from __future__ import annotations`."""
    if not isinstance(f.type, str):
        raise TypeError(f"field {f.name}: annotation {f.type!r} is not a string")
    return f.type


def _typed(where: Where, entry: str, cls: type, table: Any, skip: frozenset[str] = frozenset(),
           optional: dict[str, Any] | None = None) -> dict[str, Any]:
    """Constructor arguments of `cls` from a TOML table: every field given (a key of `optional`
    may be left out and takes its value from there), none unknown, each of its annotated type
    (an integer where `int`, a number where `float`, a string where `str`)."""
    optional = optional or {}
    if not isinstance(table, dict):
        raise where.fail(entry, None, f"must be a table, got {table!r}")
    wanted = {f.name: _annotation(f) for f in fields(cls) if f.name not in skip}
    for key in table:
        if key not in wanted and key not in skip:
            raise where.fail(entry, key, f"unknown field (fields: {', '.join(sorted(wanted))})")
    out = {}
    for name, kind in wanted.items():
        if name not in table:
            if name not in optional:
                raise where.fail(entry, name, "missing")
            out[name] = optional[name]
            continue
        v = table[name]
        ok = {"int": isinstance(v, int) and not isinstance(v, bool),
              "float": isinstance(v, (int, float)) and not isinstance(v, bool),
              "str": isinstance(v, str), "str | None": isinstance(v, str)}[kind]
        if not ok:
            raise where.fail(entry, name, f"must be {_KIND[kind]}, got {v!r} ({type(v).__name__})")
        out[name] = float(v) if kind == "float" else v
    return out


def _check_ranges(where: Where, entry: str, values: dict[str, Any],
                  rules: tuple[tuple[str, Any, str], ...]) -> None:
    for name, ok, text in rules:
        if not ok(values[name]):
            raise where.fail(entry, name, f"must be {text}, got {values[name]!r}")


def _pos(v: float) -> bool:
    return v > 0


def _nonneg(v: float) -> bool:
    return v >= 0


def _frac(v: float) -> bool:
    return 0 < v <= 1


_HARDWARE_RULES = (
    ("gpus", lambda v: v >= 1, ">= 1"), ("hbm_gb", _pos, "> 0"), ("hbm_bw_gbs", _pos, "> 0"),
    ("bf16_tflops", _pos, "> 0"), ("nvlink_gbs", _pos, "> 0"), ("nvlink_latency_s", _nonneg, ">= 0"),
    ("ib_gbs", _pos, "> 0"), ("cost_per_hour", _nonneg, ">= 0"), ("power_kw", _nonneg, ">= 0"),
    ("gpu_tdp_w", _pos, "> 0"), ("power_cap_frac", _frac, "in (0, 1]"), ("machine_power_frac", _pos, "> 0"),
)
_ROOFLINE_RULES = (
    ("mfu", _frac, "in (0, 1]"), ("mfu_large", _frac, "in (0, 1]"), ("mbu", _frac, "in (0, 1]"),
    ("mfu_knee_tokens", _pos, "> 0"), ("prompt_layer_overhead_s", _nonneg, ">= 0"),
    ("token_layer_overhead_s", _nonneg, ">= 0"), ("token_seq_layer_overhead_s", _nonneg, ">= 0"),
    ("prompt_cap_slowdown", _pos, "> 0"),
)
_MODEL_RULES = tuple((f, lambda v: v >= 1, ">= 1") for f in (
    "layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "vocab", "params", "max_context",
    "dtype_bytes", "experts", "experts_per_token")) + (
    ("mlp", lambda v: v in ("swiglu", "gelu", "relu"), "swiglu, gelu or relu"),
    ("positions", lambda v: v in ("rope", "alibi", "learned"), "rope, alibi or learned"))


def hardware_entry(where: Where, name: str, table: Any) -> HardwareSpec:
    kw = _typed(where, name, HardwareSpec, table, skip=frozenset({"name", "roofline"}),
                optional={"profile_name": None})
    _check_ranges(where, name, kw, _HARDWARE_RULES)
    if "roofline" not in table:
        raise where.fail(name, "roofline", "missing (a [NAME.roofline] table)")
    rf = _typed(where, f"{name}.roofline", RooflineCalibration, table["roofline"],
                skip=frozenset({"fitted_ref"}), optional={"fitted_on": ""})
    _check_ranges(where, f"{name}.roofline", rf, _ROOFLINE_RULES)
    if rf["mfu_large"] > rf["mfu"]:
        raise where.fail(f"{name}.roofline", "mfu_large",
                         f"must be <= mfu ({rf['mfu']}), got {rf['mfu_large']}")
    spec = HardwareSpec(name=name, roofline=RooflineCalibration(**rf), **kw)
    rule_kw = spec.gpus * spec.gpu_tdp_w * spec.machine_power_frac / 1000.0
    if abs(spec.power_kw - rule_kw) > 1e-9:
        raise where.fail(name, "power_kw", f"{spec.power_kw} != gpus * gpu_tdp_w * machine_power_frac / 1000 "
                                           f"= {rule_kw}")
    return spec


def model_entry(where: Where, name: str, table: Any) -> ModelSpec:
    kw = _typed(where, name, ModelSpec, table, skip=frozenset({"name"}),
                optional={"experts": 1, "experts_per_token": 1,       # MoE keys: dense by default
                          "mlp": "swiglu", "positions": "rope"})
    _check_ranges(where, name, kw, _MODEL_RULES)
    try:
        return ModelSpec(name=name, **kw)
    except ValueError as e:   # the MoE rules of ModelSpec.__post_init__ (they name the fields)
        field = "experts_per_token" if "experts_per_token" in str(e) else "params"
        raise where.fail(name, field, str(e).split(": ", 1)[-1]) from None


def design_entry(where: Where, name: str, table: Any, hardware: dict[str, HardwareSpec]) -> Design:
    kw = _typed(where, name, Design, table, skip=frozenset({"name"}),
                optional={"prompt": None, "token": None, "machine": None, "description": ""})
    if kw["scheduler"] not in ("splitwise", "mixed"):
        raise where.fail(name, "scheduler", f"must be \"splitwise\" or \"mixed\", got {kw['scheduler']!r}")
    need, refuse = ((("prompt", "token"), ("machine",)) if kw["scheduler"] == "splitwise"
                    else (("machine",), ("prompt", "token")))
    for f in need:
        if kw[f] is None:
            raise where.fail(name, f, f"missing (a {kw['scheduler']} design names it)")
        if kw[f] not in hardware:
            raise where.fail(name, f, f"unknown hardware {kw[f]!r}; valid names: {', '.join(sorted(hardware))}")
    for f in refuse:
        if kw[f] is not None:
            raise where.fail(name, f, f"not a field of a {kw['scheduler']} design (it names {' and '.join(need)})")
    return Design(name=name, **kw)


def overhead_entries(where: Where, raw: dict[str, Any], hardware: dict[str, HardwareSpec]) -> dict[str, float]:
    for key in raw:
        if key != "overhead_s":
            raise where.fail(key, None, "unknown table (kv_transfer.toml holds [overhead_s])")
    table = raw.get("overhead_s", {})
    if not isinstance(table, dict):
        raise where.fail("overhead_s", None, f"must be a table, got {table!r}")
    out = {}
    for name, v in table.items():
        if name not in hardware:
            raise where.fail("overhead_s", name, f"unknown hardware; valid names: {', '.join(sorted(hardware))}")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise where.fail("overhead_s", name, f"must be a number, got {v!r} ({type(v).__name__})")
        if v < 0:
            raise where.fail("overhead_s", name, f"must be >= 0, got {v!r}")
        out[name] = float(v)
    return out


def link_fits(where: dict[str, Where], hardware: dict[str, HardwareSpec]) -> dict[str, HardwareSpec]:
    """Each machine whose roofline was fitted on another (`fitted_on`) with that machine attached:
    the machine named must have its own fit and the same GPU count."""
    out = {}
    for name, spec in hardware.items():
        ref = spec.roofline.fitted_on
        if ref and (ref not in hardware or hardware[ref].roofline.fitted_on or hardware[ref].gpus != spec.gpus):
            raise where[name].fail(f"{name}.roofline", "fitted_on",
                                   f"{ref!r} must name a machine with its own fit and the same GPU count")
        if ref:
            spec = replace(spec, roofline=replace(spec.roofline, fitted_ref=hardware[ref]))
        out[name] = spec
    return out
