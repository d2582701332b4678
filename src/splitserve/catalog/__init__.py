"""Hardware, model and design specs, kept as data in `hardware.toml`, `models.toml`,
`designs.toml` and `kv_transfer.toml`, and a user's own files of the same names on top.

    load_catalog("my-catalog/")  -> Catalog (the built-in entries, the directory's added or replacing)
    load_hardware("dgx-h100")  -> HardwareSpec (one 8-GPU machine, tensor parallel inside it)
    load_model("llama2-70b")   -> ModelSpec
    kv_capacity_tokens(model, hw)  -> tokens of KV cache one machine holds

Every entry, built-in or a user's, goes through the same checks (`_hardware_entry`, `_model_entry`,
`_design_entry`, `_overhead_entries`): each field present, of its type, in its range; a UserError
names the file, the entry and the field. `load_hardware(name, catalog)` and the like look a name up
in the catalog given, or in the built-in one (read once per process).

Units: bytes, seconds, watts unless a field name says otherwise (`hbm_gb` is 1e9 bytes,
`hbm_bw_gbs` is 1e9 bytes/s, `bf16_tflops` is 1e12 FLOP/s, `power_kw` is kilowatts).
"""

from __future__ import annotations

import hashlib
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from splitserve.errors import UserError

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


@dataclass(frozen=True, slots=True)
class RooflineCalibration:
    """Efficiency constants of `splitserve.perf.roofline.RooflinePerfModel`, fitted per hardware.

    With L layers, T batched prompt tokens, b decoding requests:
    prompt = cap_slowdown * (L * prompt_layer_overhead_s
                             + max(F / (P * mfu(T)), bytes / (BW * mbu)))
        1 / mfu(T) = 1 / mfu + (1 / mfu_large - 1 / mfu) * T / (T + mfu_knee_tokens)
    decode = L * (token_layer_overhead_s + b * token_seq_layer_overhead_s)
             + max(F / (P * mfu), bytes / (BW * mbu))
    See docs/perf-model.md for the derivation and the fit.
    """

    mfu: float                       # model FLOPs utilisation of a small prompt batch
    mfu_large: float                 # ... of a very large prompt batch (power-limited clocks)
    mfu_knee_tokens: float           # batched prompt tokens half way between the two
    mbu: float                       # memory-bandwidth utilisation (weights + KV reads)
    prompt_layer_overhead_s: float   # fixed cost per layer of one prompt iteration
    token_layer_overhead_s: float    # fixed cost per layer of one decode iteration
    token_seq_layer_overhead_s: float  # extra decode cost per layer per request in the batch
    prompt_cap_slowdown: float       # prompt-phase slowdown from the GPU power cap (1 = uncapped)
    fitted_on: str = ""              # machine whose profile the overheads were fitted to ("" = this
                                     # one): their tensor-parallel all-reduces ran on ITS links
    fitted_ref: HardwareSpec | None = field(default=None, compare=False, repr=False)
                                     # that machine, as the catalog holding both has it (set by
                                     # the catalog; None: look `fitted_on` up in the built-in one)


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One machine: `gpus` GPUs joined by NVLink, tensor parallel across them."""

    name: str
    gpu: str
    gpus: int
    hbm_gb: float            # per GPU, 1e9 bytes
    hbm_bw_gbs: float        # per GPU, 1e9 bytes/s
    bf16_tflops: float       # per GPU, dense (no sparsity), 1e12 FLOP/s
    nvlink_gbs: float        # per GPU, total GPU-to-GPU bandwidth, both directions together, 1e9
                             # bytes/s: NVLink, or PCIe on a machine without NVLink
    nvlink_latency_s: float  # per step of a ring collective between two GPUs of the machine, s
    ib_gbs: float            # per machine, inter-machine bandwidth usable by one KV transfer, 1e9 B/s
    cost_per_hour: float     # $ per machine-hour
    power_kw: float          # provisioned power of the machine (GPUs), kW
    gpu_tdp_w: float         # rated GPU power (TDP), W
    power_cap_frac: float    # GPU power cap as a fraction of TDP (1.0 = uncapped)
    machine_power_frac: float  # provisioned machine power as a fraction of gpus * TDP
    profile_name: str | None   # `hardware` column of profile CSVs, None when never profiled
    roofline: RooflineCalibration

    @property
    def hbm_bytes(self) -> float:
        """HBM of the whole machine in bytes."""
        return self.gpus * self.hbm_gb * 1e9

    @property
    def ib_bytes_per_s(self) -> float:
        return self.ib_gbs * 1e9

    @property
    def link_bytes_per_s(self) -> float:
        """GPU-to-GPU bandwidth one way (half of `nvlink_gbs`, which counts both directions): what a
        ring collective's step moves per second, each GPU sending and receiving at once."""
        return self.nvlink_gbs * 1e9 / 2.0

    @property
    def power_cap_w(self) -> float:
        """Most the machine's GPUs may draw together: cap * TDP * gpus."""
        return self.power_cap_frac * self.gpu_tdp_w * self.gpus


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Shape of a decoder-only transformer, dense or mixture of experts (MoE).

    An MoE model (`experts` > 1) replaces every layer's MLP by `experts` SwiGLU MLPs of width
    `intermediate` (three hidden x intermediate matrices each) and a router; each token runs
    `experts_per_token` of them. `params` counts every expert; `active_params` what one token uses.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int        # MLP width; an MoE model's width of ONE expert
    vocab: int
    params: int              # all weights, every expert included
    max_context: int
    dtype_bytes: int
    experts: int = 1                 # MLPs per layer (1 = dense)
    experts_per_token: int = 1       # MLPs each token runs (top-k routing)

    def __post_init__(self) -> None:
        if not 1 <= self.experts_per_token <= self.experts:
            raise ValueError(
                f"model {self.name!r}: need 1 <= experts_per_token ({self.experts_per_token}) "
                f"<= experts ({self.experts})"
            )
        if self.experts > 1 and self.params <= self.expert_params:
            raise ValueError(
                f"model {self.name!r}: params {self.params} must exceed the experts' "
                f"{self.expert_params} (attention, embeddings and router come on top)"
            )

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token: 2 * layers * kv_heads * head_dim * dtype_bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        """Every weight, all experts included (what the GPUs must hold)."""
        return self.params * self.dtype_bytes

    @property
    def params_per_expert(self) -> int:
        """One expert's SwiGLU MLP summed over the layers: layers * 3 * hidden * intermediate.
        0 for a dense model (its MLP counts as shared, not as an expert)."""
        return 3 * self.layers * self.hidden * self.intermediate if self.is_moe else 0

    @property
    def expert_params(self) -> int:
        """All experts of all layers: experts * params_per_expert (0 for a dense model)."""
        return self.experts * self.params_per_expert

    @property
    def shared_params(self) -> int:
        """Weights every token uses: embeddings, attention, norms, router (all of a dense model)."""
        return self.params - self.expert_params

    @property
    def active_params(self) -> int:
        """Weights one token computes with: shared + experts_per_token experts (params if dense)."""
        return self.shared_params + self.experts_per_token * self.params_per_expert


# ----------------------------------------------------------------------------- designs


@dataclass(frozen=True, slots=True)
class Design:
    """A cluster design of designs.toml: a Splitwise design names the machine kind of its prompt
    and of its token pool, a baseline one machine kind for every machine (designs.py builds the
    cluster)."""

    name: str
    scheduler: str                # "splitwise" or "mixed"
    prompt: str | None = None     # hardware of the prompt pool (splitwise)
    token: str | None = None      # hardware of the token pool (splitwise)
    machine: str | None = None    # hardware of every machine (baseline)
    description: str = ""

    @property
    def split(self) -> bool:
        return self.scheduler == "splitwise"


# ----------------------------------------------------------------------------- checking

FILES = ("hardware.toml", "models.toml", "designs.toml", "kv_transfer.toml")


class _Where:
    """Names what an error is about: the file, the entry, the field."""

    def __init__(self, file: str):
        self.file = file

    def fail(self, entry: str | None, field: str | None, problem: str) -> UserError:
        at = "".join((f" [{entry}]" if entry is not None else "", f" {field}" if field else ""))
        return UserError(f"catalog {self.file}:{at}: {problem}")


_KIND = {"int": "an integer", "float": "a number", "str": "a string", "str | None": "a string"}


def _typed(where: _Where, entry: str, cls: type, table: Any, skip: frozenset[str] = frozenset(),
           optional: dict[str, Any] | None = None) -> dict[str, Any]:
    """Constructor arguments of `cls` from a TOML table: every field given (a key of `optional`
    may be left out and takes its value from there), none unknown, each of its annotated type
    (an integer where `int`, a number where `float`, a string where `str`)."""
    optional = optional or {}
    if not isinstance(table, dict):
        raise where.fail(entry, None, f"must be a table, got {table!r}")
    wanted = {f.name: f.type for f in fields(cls) if f.name not in skip}
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


def _check_ranges(where: _Where, entry: str, values: dict[str, Any],
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
    "dtype_bytes", "experts", "experts_per_token"))


def _hardware_entry(where: _Where, name: str, table: Any) -> HardwareSpec:
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


def _model_entry(where: _Where, name: str, table: Any) -> ModelSpec:
    kw = _typed(where, name, ModelSpec, table, skip=frozenset({"name"}),
                optional={"experts": 1, "experts_per_token": 1})   # MoE keys: dense by default
    _check_ranges(where, name, kw, _MODEL_RULES)
    try:
        return ModelSpec(name=name, **kw)
    except ValueError as e:   # the MoE rules of ModelSpec.__post_init__ (they name the fields)
        field = "experts_per_token" if "experts_per_token" in str(e) else "params"
        raise where.fail(name, field, str(e).split(": ", 1)[-1]) from None


def _design_entry(where: _Where, name: str, table: Any, hardware: dict[str, HardwareSpec]) -> Design:
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


def _overhead_entries(where: _Where, raw: dict[str, Any], hardware: dict[str, HardwareSpec]) -> dict[str, float]:
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


def _link_fits(where: dict[str, _Where], hardware: dict[str, HardwareSpec]) -> dict[str, HardwareSpec]:
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


# ----------------------------------------------------------------------------- the catalog


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


def _parse(tables: dict[str, tuple[_Where, dict[str, Any]]], *, base: Catalog | None = None
           ) -> tuple[dict, dict, dict, dict, list[str], dict[str, _Where]]:
    """Every entry of the files read (file name -> (where, parsed TOML)) checked, over `base`'s."""
    hw = dict(base.hardware) if base else {}
    models = dict(base.models) if base else {}
    designs = dict(base.designs) if base else {}
    overheads = dict(base.kv_overhead_s) if base else {}
    replaced: list[str] = []
    hw_where: dict[str, _Where] = {}

    def merge(file: str, into: dict, entry: Callable[[_Where, str, Any], Any]) -> None:
        if file not in tables:
            return
        where, raw = tables[file]
        for name, t in raw.items():
            if name in into:
                replaced.append(f"{where.file} [{name}]")
            into[name] = entry(where, name, t)
            if into is hw:
                hw_where[name] = where

    merge("hardware.toml", hw, _hardware_entry)
    merge("models.toml", models, _model_entry)
    merge("designs.toml", designs, lambda where, name, t: _design_entry(where, name, t, hw))
    if "kv_transfer.toml" in tables:
        where, raw = tables["kv_transfer.toml"]
        for name, v in _overhead_entries(where, raw, hw).items():
            if name in overheads:
                replaced.append(f"{where.file} [overhead_s] {name}")
            overheads[name] = v
    return hw, models, designs, overheads, replaced, hw_where


@lru_cache(maxsize=1)
def builtin_catalog() -> Catalog:
    """The package's own catalog (read once per process)."""
    tables = {}
    for f in FILES:
        with resources.files(__name__).joinpath(f).open("rb") as fh:
            tables[f] = (_Where(f"splitserve/catalog/{f}"), tomllib.load(fh))
    hw, models, designs, overheads, _, hw_where = _parse(tables)
    return Catalog(_link_fits(hw_where, hw), models, designs, overheads)


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
            tables[f] = (_Where(str(path)), tomllib.loads(data.decode("utf-8")))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"catalog {path}: not valid TOML: {e}") from None
    if not tables:
        raise UserError(f"catalog {root}: holds none of {', '.join(FILES)}")
    hw, models, designs, overheads, replaced, hw_where = _parse(tables, base=base)
    base_where = {n: _Where("splitserve/catalog/hardware.toml") for n in hw if n not in hw_where}
    hw = _link_fits({**base_where, **hw_where}, {n: replace(s, roofline=replace(s.roofline, fitted_ref=None))
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


# ----------------------------------------------------------------------------- memory


def activation_reserve_bytes(model: ModelSpec, tp: int, tokens: int | None = None) -> int:
    """Memory held back for activations when sizing the KV cache, all `tp` GPUs together.

    The serving engine sizes its KV cache after a profiling forward pass over the largest batch
    it will run (vLLM does exactly this), so the reserve is the peak live activation set of one
    pass over `tokens` tokens (default: `model.max_context`, one longest prompt), per GPU:
    the residual stream and the normalised layer input (2 * hidden, replicated on every GPU),
    the layer's own Q, K, V (heads + 2 * kv_heads) * head_dim / tp, and the MLP's two
    up-projections 2 * intermediate / tp (each of the experts_per_token experts a token is routed to,
    for a mixture of experts); times dtype_bytes, times tp GPUs. Framework and CUDA
    overheads are covered by `memory_utilization` < 1, not here.
    """
    if tokens is None:
        tokens = model.max_context
    per_gpu_per_token = (
        2 * model.hidden
        + (model.heads + 2 * model.kv_heads) * model.head_dim // tp
        + 2 * model.intermediate * model.experts_per_token // tp
    ) * model.dtype_bytes
    return tp * tokens * per_gpu_per_token


def kv_capacity_tokens(
    model: ModelSpec,
    hw: HardwareSpec,
    tp: int | None = None,
    memory_utilization: float = 0.9,
    pp: int = 1,
) -> int:
    """Tokens of KV cache one model instance holds.

    (tp * pp * HBM * memory_utilization - weights - pp * activation reserve) / kv_bytes_per_token,
    rounded down. The instance runs on `tp` GPUs of one machine (default: all of them) in each of
    `pp` pipeline stages; every stage holds its own activations, and the weights and the KV of a
    token are spread over the stages. Raises UserError when the weights and the reserve do not fit.
    """
    if tp is None:
        tp = hw.gpus
    if not 1 <= tp <= hw.gpus:
        raise UserError(f"tensor parallel {tp} must be between 1 and {hw.gpus} on {hw.name}")
    if pp < 1:
        raise UserError(f"pipeline stages must be at least 1, got {pp}")
    if not 0.0 < memory_utilization <= 1.0:
        raise UserError(f"memory_utilization {memory_utilization} must be in (0, 1]")
    usable = tp * pp * hw.hbm_gb * 1e9 * memory_utilization
    free = usable - model.weight_bytes - pp * activation_reserve_bytes(model, tp)
    if free <= 0:
        raise UserError(
            f"{model.name} ({model.weight_bytes / 1e9:.0f} GB of weights) does not fit on "
            f"{tp * pp} GPUs (tp {tp} x pp {pp}) of {hw.name} ({usable / 1e9:.0f} GB usable at "
            f"memory_utilization={memory_utilization})"
        )
    return int(free // model.kv_bytes_per_token)
