"""Cluster designs (data in catalog/designs.toml) and the concrete cluster a run simulates."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..catalog import Catalog, Design, builtin_catalog
from ..errors import UserError
from .instance import Instance, make_instance
from ..policy.state import Pool


@dataclass(frozen=True, slots=True)
class Parallelism:
    """Tensor and pipeline degree of each pool's instances; None: the default (tp = all GPUs of
    one machine, pp = 1). A pool's own setting wins over the cluster-wide one."""

    tp: int | None = None
    pp: int | None = None
    prompt_tp: int | None = None
    prompt_pp: int | None = None
    token_tp: int | None = None
    token_pp: int | None = None
    ep: int | None = None      # expert parallel of every instance (mixture of experts; = its tp)

    def of(self, pool: Pool) -> tuple[int | None, int | None]:
        def pick(own: int | None, common: int | None) -> int | None:
            return common if own is None else own

        if pool is Pool.PROMPT:
            return pick(self.prompt_tp, self.tp), pick(self.prompt_pp, self.pp)
        if pool is Pool.TOKEN:
            return pick(self.token_tp, self.tp), pick(self.token_pp, self.pp)
        return self.tp, self.pp


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    design: Design
    groups: tuple[tuple[Instance, Pool, int], ...]    # (instance, home pool, count)

    @property
    def machines(self) -> int:
        """Instances (machines, for default instances)."""
        return sum(n for _, _, n in self.groups)

    def unsplit(self) -> "ClusterSpec":
        """The same instances as one mixed pool (an unsplit system run on a Splitwise design)."""
        d = replace(self.design, name=f"{self.design.name} unsplit", scheduler="mixed")
        return ClusterSpec(d, tuple((inst, Pool.MIXED, n) for inst, _, n in self.groups))

    @property
    def gpus(self) -> int:
        return sum(inst.gpus * n for inst, _, n in self.groups)

    def label(self) -> str:
        def pool(pool: Pool) -> list[str]:
            return [f"{n}{'' if len(kinds) == 1 else ' ' + inst.hardware}"
                    f"{'' if inst.name == inst.hardware else f' tp{inst.tp}pp{inst.pp}'}"
                    for inst, p, n in self.groups if p is pool]

        kinds = {inst.hardware for inst, _, _ in self.groups}
        if self.design.split:
            return f"{self.design.name} ({' + '.join(pool(Pool.PROMPT))}P, {' + '.join(pool(Pool.TOKEN))}T)"
        default = all(inst.name == inst.hardware for inst, _, _ in self.groups)
        return f"{self.design.name} ({' + '.join(pool(Pool.MIXED))} {'machines' if default else 'instances'})"


def load_designs(catalog: Catalog | None = None) -> dict[str, Design]:
    """The designs of `catalog` (default: the built-in one), by name."""
    return dict((catalog or builtin_catalog()).designs)


def design_names(catalog: Catalog | None = None) -> list[str]:
    return sorted(load_designs(catalog))


Count = int | str   # instances, or a mix of machine kinds: "4*dgx-a100+2*dgx-h100"


def parse_count(flag: str, value: Count, kind: str) -> list[tuple[str, int]]:
    """A pool's instances by machine kind: N of the design's `kind`, or N*KIND+M*KIND (kinds of the
    catalog; a mix of hardware in one pool)."""
    parts = [(kind, value)] if isinstance(value, int) else []
    if isinstance(value, str):
        for term in value.replace(" ", "").split("+"):
            n, star, k = term.partition("*")
            try:
                parts.append((k if star else kind, int(n)))
            except ValueError:
                raise UserError(f"{flag} {value!r}: give a count (4) or counts of machine kinds "
                                f"(4*dgx-a100+2*dgx-h100)") from None
    for _, count in parts:
        if count < 1:
            raise UserError(f"{flag} must be at least 1, got {count}")
    return parts


def make_cluster(design: str, *, prompt_machines: Count | None = None,
                 token_machines: Count | None = None, machines: Count | None = None,
                 parallel: Parallelism = Parallelism(), catalog: Catalog | None = None) -> ClusterSpec:
    """The cluster of `design` with these instance counts; each instance has the parallelism
    `parallel` gives its pool (instance.py). A count counts instances (machines by default); a
    count such as "2*dgx-h100+1*dgx-a100" mixes machine kinds in the pool. Designs and machine
    kinds are `catalog`'s (default: the built-in one)."""
    d = (catalog or builtin_catalog()).design(design)

    def groups(flag: str, value: Count, kind: str, pool: Pool) -> tuple:
        return tuple((make_instance(k, *parallel.of(pool), parallel.ep, catalog=catalog), pool, n)
                     for k, n in parse_count(flag, value, kind))

    if d.split:
        if machines is not None:
            raise UserError(f"{design} is a Splitwise design: give --prompt-machines and "
                            f"--token-machines, not --machines")
        if prompt_machines is None or token_machines is None:
            raise UserError(f"{design} needs --prompt-machines N and --token-machines M")
        prompt, token = d.kinds()
        return ClusterSpec(d, groups("--prompt-machines", prompt_machines, prompt, Pool.PROMPT)
                           + groups("--token-machines", token_machines, token, Pool.TOKEN))
    if prompt_machines is not None or token_machines is not None:
        raise UserError(f"{design} is an unsplit baseline: give --machines N, not prompt/token counts")
    if machines is None:
        raise UserError(f"{design} needs --machines N")
    if any(v is not None for v in (parallel.prompt_tp, parallel.prompt_pp, parallel.token_tp, parallel.token_pp)):
        raise UserError(f"{design} is an unsplit baseline: give --tp/--pp, not prompt/token parallelism")
    (machine,) = d.kinds()
    return ClusterSpec(d, groups("--machines", machines, machine, Pool.MIXED))
