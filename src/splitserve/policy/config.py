"""The policy's settings, in one object, and their command-line options, written once.

`PolicyConfig` holds every setting of the scheduling policies: the machine-level batching rules
(BatchingConfig, policy/machine.py), the cluster-level routing (RoutingConfig, policy/cluster.py)
and the KV transfer mode's threshold (policy/kv_transfer.py). The simulator runs with it, and the
live router and every worker run with the same object (serve sends it to each worker once).

`policy_options` adds one command-line option per setting to a typer command (`simulate` and
`serve` both use it), so the two commands accept the same policy options with the same names,
defaults and help, taken from the dataclasses' own defaults; tests/test_policy_options.py
compares them.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import typing
from dataclasses import dataclass
from typing import Any, Callable, Optional, overload

from ..errors import UserError
from .cluster import RoutingConfig
from .cluster_schedulers import CLUSTER_SCHEDULERS
from .kv_allocation import ALLOCATIONS, RECOMPUTES
from .kv_transfer import DEFAULT_LAYERWISE_THRESHOLD
from .machine import BatchingConfig
from .predictor import PRESETS as PREDICTORS
from .schedulers import SCHEDULERS
from .systems import SYSTEMS


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyConfig:
    batching: BatchingConfig = BatchingConfig()
    routing: RoutingConfig = RoutingConfig()
    layerwise_threshold: int = DEFAULT_LAYERWISE_THRESHOLD   # prompt-batch tokens from which KV streams by layer
    system: str = ""          # the serving system these settings came from (--policy, systems.py); "": none

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "PolicyConfig":
        d = json.loads(text)
        return cls(batching=BatchingConfig(**d["batching"]), routing=RoutingConfig(**d["routing"]),
                   layerwise_threshold=d["layerwise_threshold"], system=d.get("system", ""))

    @property
    def split(self) -> bool | None:
        """Whether the named system splits the phases (None: no system named, the design decides)."""
        from .systems import system
        return system(self.system).split if self.system else None


@dataclass(frozen=True, slots=True)
class Option:
    """One command-line option of a policy setting: `--name` sets `path` (section.field or field)."""

    name: str
    path: str
    help: str
    flag: bool = False   # a boolean switch: --no-... turns the setting off, any other name turns it on

    def given(self, on: bool) -> Any:
        """The setting when the switch is (not) on the command line."""
        return not on if self.name.startswith("no-") else on

    def default(self) -> Any:
        obj = PolicyConfig()
        for part in self.path.split("."):
            obj = getattr(obj, part)
        return obj


OPTIONS = (
    Option("prompt-cap", "batching.prompt_token_cap",
           "Prefill tokens in one batch at most; a longer prompt runs alone (paper: 2048)."),
    Option("chunk-size", "batching.chunk_size",
           "Chunked prefill: tokens per iteration, decodes first, then prompt chunks (0: whole prompts)."),
    Option("preemption-limit", "batching.preemption_limit",
           "Times one request may be preempted (its KV dropped, recomputed later) for a prompt."),
    Option("machine-scheduler", "batching.scheduler",
           "Machine-level scheduler (policy/schedulers/, each described there): "
           + ", ".join(f"{n} ({s.about})" if s.about else n for n, s in SCHEDULERS.items()) + "."),
    Option("kv-allocation", "batching.kv_allocation",
           "How a machine allocates KV (policy/kv_allocation.py): reserve (a request holds its prompt and every "
           "token it may generate from admission: the Splitwise authors' simulator) or on-demand (the blocks of "
           "the tokens it has, grown a block at a time; a decode that finds none preempts the newest, which "
           "recomputes later: vLLM, SGLang). --policy vllm, sarathi, distserve, tetriinfer and aladdin allocate "
           "on demand, as those systems do; `serve` and `twin` default to on-demand; orca, fastertransformer and "
           "ecoserve reserve by their own rules, lightllm allocates on demand by its own (token by token, "
           "admitting by its estimate of the peak KV)."),
    Option("kv-watermark", "batching.kv_watermark",
           "--kv-allocation on-demand: share of a machine's KV blocks an admission leaves free (vLLM's watermark)."),
    Option("recompute", "batching.recompute",
           "Where a decode preempted on its token machine (its prompt ran on another) recomputes its KV: in-place "
           "(a prefill of its prompt and outputs there), prompt-pool (routed again as at arrival, ahead of the "
           "requests waiting for that token machine: a prompt machine recomputes, its KV is sent again), or auto "
           "(prompt-pool with --kv-allocation on-demand: as fast at the SLOs, faster past them, "
           "benchmarks/sim/README.md; in-place under reserve)."),
    Option("orca-max-len", "batching.max_len",
           "--machine-scheduler orca: KV tokens reserved per request at admission (0: its prompt + output)."),
    Option("prompt-queue-threshold", "routing.prompt_queue_threshold",
           "Prefill tokens beyond which a prompt machine is full and work overflows to the mixed pool (see --overflow-rule)."),
    Option("overflow-rule", "routing.overflow_rule",
           "What counts against --prompt-queue-threshold: authors (the Splitwise authors' simulator: queued + "
           "running prefill tokens + the arriving prompt, while prompts are queued) or queued (queued prefill tokens)."),
    Option("borrow-rule", "routing.borrow_rule",
           "How the mixed pool borrows machines: authors (the Splitwise authors' simulator: prompt and token "
           "machine picked apart, a pool may lend its last machine, a request runs whole on the shortest queue "
           "of all when neither pool can lend, a borrowed machine goes home when idle) or splitserve (an "
           "overflowing request runs whole on a mixed machine, a pool keeps its last machine, a borrowed "
           "machine goes home when it holds no work of the other kind)."),
    Option("token-queue-threshold", "routing.token_queue_threshold",
           "Decode tokens waiting for KV memory beyond which a token machine is full."),
    Option("token-tbt-slo", "routing.token_tbt_slo",
           "Seconds (0: off): a token machine is full too when its next decode step with the arriving request "
           "would take longer (a latency-aware full, policy/pools.py; the simulator's step times, the router's fit)."),
    Option("no-mixed-pool", "routing.mixed_pool", "No mixed pool: no overflow, no borrowing of machines.", flag=True),
    Option("kv-pull", "routing.kv_pull",
           "DistServe's pull: a token machine takes a prefilled prompt's KV when it has memory, the prompt "
           "machine holding it meanwhile (default: reserve token-side memory before the prefill). Needs "
           "--no-mixed-pool; simulated only.", flag=True),
    Option("decode-dispatch", "routing.decode_dispatch",
           "How a split request's token machine is chosen: jsq (fewest pending tokens) or tetriinfer "
           "(power of two among those with memory for the predicted output, the lower share of heavy decodes)."),
    Option("predictor", "routing.predictor",
           f"Output-length predictor of predictive policies: {', '.join(PREDICTORS)} (policy/predictor.py: "
           "the papers' accuracies)."),
    Option("cluster-scheduler", "routing.cluster_scheduler",
           "Cluster-level scheduler: auto (splitwise for a design with prompt and token pools, else jsq) or "
           f"{', '.join(CLUSTER_SCHEDULERS)} (policy/cluster_schedulers.py CLUSTER_SCHEDULERS; tetriinfer: no "
           "mixed pool, TetriInfer's decode dispatch, idle instances flip role: policy/instance_flip.py)."),
    Option("flip-idle-s", "routing.flip_idle_s",
           "--cluster-scheduler tetriinfer: seconds an instance must be idle (no pending tokens) before it "
           "flips to the other role, whose instances all have load (TetriInfer: a minute)."),
    Option("prefix-slack", "routing.prefix_slack",
           "Prefix-aware routing (policy/prefix_routing.py), for requests whose prompts caches may hold: a "
           "request goes to the machine holding its longest cached prefix unless that machine's pending tokens "
           "pass the least-loaded one's by more than this; -1: off (least pending tokens alone)."),
    Option("scale-window", "routing.scale_window",
           "--cluster-scheduler aladdin: seconds of arrivals whose rate and lengths size the workers taking "
           "new requests (Eq. 7; the others drain); 0: no scaling."),
    Option("aladdin-ttft-slo", "routing.aladdin_ttft_slo",
           "--cluster-scheduler aladdin: TTFT SLO in seconds its placement keeps (0: the prefill time of "
           "4096 tokens, the paper's choice)."),
    Option("aladdin-atgt-slo", "routing.aladdin_atgt_slo",
           "--cluster-scheduler aladdin: average token generation time SLO in seconds (0: 1.3 times a lone "
           "request's decode step at 4096 tokens, the paper's choice)."),
    Option("aladdin-theta", "routing.aladdin_theta",
           "--cluster-scheduler aladdin: theta, the share of the ATGT room and of the decodes' saved time "
           "it packs to (the paper's knob against prediction error, 0 < theta <= 1; value not given)."),
    Option("layerwise-threshold", "layerwise_threshold",
           "Prompt-batch tokens from which KV moves layer by layer, overlapped with the prompt (else in one shot)."),
)


SYSTEM_HELP = (f"A serving system by name, its policy settings at once (policy/systems.py): {', '.join(SYSTEMS)}. "
               "Options given beside it win; unsplit systems run the design's machines as one mixed pool.")


def _param(o: Option, defaults: dict[str, Any]) -> inspect.Parameter:
    import typer

    name = o.name.replace("-", "_")
    if o.flag:
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                                 default=typer.Option(False, f"--{o.name}", help=o.help, rich_help_panel="Policy"))
    # None: not given (a value given on the command line wins over --policy's, even the default's)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[type(o.default())],
                             default=typer.Option(None, f"--{o.name}", help=f"{o.help} (default: {defaults.get(o.path, o.default())})",
                                                  rich_help_panel="Policy", show_default=False))


SERVING = {"batching.kv_allocation": "on-demand"}   # the live system's defaults (`serve`, `twin`): it cannot
                                                   # know output lengths, so it allocates on demand


@overload
def policy_options(command: Callable[..., Any], *, defaults: dict[str, Any] | None = None) -> Callable[..., Any]: ...


@overload
def policy_options(command: None = None, *,
                   defaults: dict[str, Any] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...


def policy_options(command: Callable[..., Any] | None = None, *,
                   defaults: dict[str, Any] | None = None) -> Callable[..., Any]:
    """Give a typer command one option per policy setting; it receives them as `policy=PolicyConfig`
    (UserError for a value out of range). `defaults`: the command's own, where it differs from the
    dataclasses' (SERVING; make_policy). As `@policy_options` or `@policy_options(defaults=...)`."""
    if command is None:
        return functools.partial(policy_options, defaults=defaults)
    own = defaults or {}
    hints = typing.get_type_hints(command, include_extras=True)  # resolved where the command lives
    sig = inspect.signature(command)
    params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()
              if p.name != "policy"]

    @functools.wraps(command)
    def wrapper(**kw: Any) -> Any:
        given = {o: kw.pop(o.name.replace("-", "_")) for o in OPTIONS}   # a switch: given when on
        values = {o.path: o.given(True) if o.flag else v for o, v in given.items()
                  if (v is True if o.flag else v is not None)}
        return command(policy=make_policy(values, kw.pop("policy_system"), own), **kw)

    import typer
    extra = [_param(o, own) for o in OPTIONS] + [inspect.Parameter(
        "policy_system", inspect.Parameter.KEYWORD_ONLY, annotation=str,
        default=typer.Option("", "--policy", help=SYSTEM_HELP, show_default=False, rich_help_panel="Policy"))]
    wrapper.__signature__ = sig.replace(parameters=params + extra)  # type: ignore[attr-defined]  # typeshed's _Wrapped lacks it
    wrapper.__annotations__ = {p.name: p.annotation for p in params + extra}
    return wrapper


def make_policy(values: dict[str, Any], system: str = "", defaults: dict[str, Any] | None = None) -> PolicyConfig:
    """A PolicyConfig from the options given, {path: value}, over the settings of serving system
    `system` (systems.py), over a command's own `defaults` (serve's on-demand allocation: kept
    only where the machine scheduler can allocate on demand), over the dataclasses' defaults;
    checked: UserError names the option to fix."""
    base = dict(defaults or {})
    if system:
        from .systems import apply
        base = apply(system, base)
    values = {**_own_allocation(base, {**base, **values}), **values}
    sections: dict[str, dict[str, Any]] = {"batching": {}, "routing": {}}
    top: dict[str, Any] = {}
    for path, v in values.items():
        section, _, field = path.rpartition(".")
        (sections[section] if section else top)[field] = v
    cfg = PolicyConfig(batching=BatchingConfig(**sections["batching"]), routing=RoutingConfig(**sections["routing"]),
                       system=system, **top)
    for ok, msg in (*batching_checks(cfg.batching), *routing_checks(cfg.routing), (
            cfg.layerwise_threshold >= 0, f"--layerwise-threshold must be >= 0, got {cfg.layerwise_threshold}")):
        if not ok:
            raise UserError(msg)
    return cfg


def batching_checks(b: BatchingConfig) -> tuple[tuple[bool, str], ...]:
    """Each batching setting's check: (it holds, the message naming the option to fix)."""
    chunked = [name for name, s in SCHEDULERS.items() if s.chunked]
    own = SCHEDULERS[b.scheduler].allocation if b.scheduler in SCHEDULERS else ""
    return ((b.scheduler in SCHEDULERS,
             f"--machine-scheduler must be one of {', '.join(SCHEDULERS)}, got {b.scheduler!r}"),
            (b.chunk_size == 0 or b.scheduler in SCHEDULERS and SCHEDULERS[b.scheduler].chunked,
             f"--chunk-size applies to --machine-scheduler {' or '.join(chunked)} only (got {b.scheduler})"),
            (b.max_len >= 0, f"--orca-max-len must be >= 0, got {b.max_len}"),
            (b.kv_allocation in ALLOCATIONS,
             f"--kv-allocation must be one of {', '.join(ALLOCATIONS)}, got {b.kv_allocation!r}"),
            (own in ("", b.kv_allocation),
             f"--machine-scheduler {b.scheduler} allocates KV by its own rule: it takes --kv-allocation {own} only"),
            (0 <= b.kv_watermark < 1, f"--kv-watermark must be in [0, 1), got {b.kv_watermark}"),
            (b.recompute in RECOMPUTES, f"--recompute must be one of {', '.join(RECOMPUTES)}, got {b.recompute!r}"),
            (b.max_len == 0 or b.scheduler == "orca",
             f"--orca-max-len applies to --machine-scheduler orca only (got {b.scheduler})"),
            (b.prompt_token_cap >= 1, f"--prompt-cap must be at least 1, got {b.prompt_token_cap}"),
            (b.chunk_size >= 0, f"--chunk-size must be 0 (off) or positive, got {b.chunk_size}"),
            (b.preemption_limit >= 0, f"--preemption-limit must be >= 0, got {b.preemption_limit}"))


def routing_checks(r: RoutingConfig) -> tuple[tuple[bool, str], ...]:
    """Each routing setting's check: (it holds, the message naming the option to fix)."""
    return ((r.prompt_queue_threshold >= 0,
             f"--prompt-queue-threshold must be >= 0, got {r.prompt_queue_threshold}"),
            (r.token_queue_threshold >= 0, f"--token-queue-threshold must be >= 0, got {r.token_queue_threshold}"),
            (r.overflow_rule in ("authors", "queued"),
             f"--overflow-rule must be authors or queued, got {r.overflow_rule!r}"),
            (r.borrow_rule in ("authors", "splitserve"),
             f"--borrow-rule must be authors or splitserve, got {r.borrow_rule!r}"),
            (r.decode_dispatch in ("jsq", "tetriinfer"),
             f"--decode-dispatch must be jsq or tetriinfer, got {r.decode_dispatch!r}"),
            (r.cluster_scheduler in ("auto", *CLUSTER_SCHEDULERS),
             f"--cluster-scheduler must be one of auto, {', '.join(CLUSTER_SCHEDULERS)}, "
             f"got {r.cluster_scheduler!r}"),
            (min(r.scale_window, r.aladdin_ttft_slo, r.aladdin_atgt_slo, r.token_tbt_slo) >= 0,
             "--scale-window, --aladdin-ttft-slo, --aladdin-atgt-slo and --token-tbt-slo must be >= 0"),
            (0 < r.aladdin_theta <= 1, f"--aladdin-theta must be in (0, 1], got {r.aladdin_theta}"),
            (r.predictor in _predictors(),
             f"--predictor must be one of {', '.join(_predictors())}, got {r.predictor!r}"),
            (r.flip_idle_s >= 0, f"--flip-idle-s must be >= 0, got {r.flip_idle_s}"),
            (r.prefix_slack >= -1, f"--prefix-slack must be -1 (off) or >= 0 tokens, got {r.prefix_slack}"),
            (not (r.kv_pull and r.mixed_pool),
             "--kv-pull needs --no-mixed-pool: a mixed machine that both holds prefilled KV and "
             "waits for memory could wait on another doing the same"))


def _own_allocation(base: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """`base` (a command's defaults under a system's) with the KV allocation of the machine
    scheduler `values` (all settings) name, where it allocates by its own rule (`--policy vllm
    --machine-scheduler orca` reserves, as orca does; `--machine-scheduler lightllm` allocates on
    demand); the other allocation given on the command line is refused."""
    sched = values.get("batching.scheduler", BatchingConfig().scheduler)
    own = SCHEDULERS[sched].allocation if sched in SCHEDULERS else ""
    return {**base, "batching.kv_allocation": own} if own else base


def _predictors() -> list[str]:
    from .predictor import PRESETS
    return list(PRESETS)


def cli_args(cfg: PolicyConfig) -> list[str]:
    """The command-line options that give `cfg` (to start `serve` with a simulation's policy)."""
    args: list[str] = []
    for o in OPTIONS:
        v: Any = cfg
        for part in o.path.split("."):
            v = getattr(v, part)
        if o.flag:
            args += [f"--{o.name}"] if o.given(True) == v else []
        else:
            args += [f"--{o.name}", str(v)]
    return args + (["--policy", cfg.system] if cfg.system else [])
