"""The lists an option's help names (models, designs, hardware, workloads, serving systems, machine
schedulers, the engine's presets), taken from the catalog and the registries when the help is shown, so
they cannot go stale: an option's help writes `{models}` where the list goes.

A command made with `cls=ListedHelp` fills them in: from the built-in catalog when the command is
built, and from the user catalog (`--catalog DIR` before `--help`, or SPLITSERVE_CATALOG) when
its help is printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer.core

from ..catalog import Catalog, builtin_catalog, load_catalog
from ..engine.presets import PRESETS
from ..errors import UserError
from ..policy.schedulers import SCHEDULERS
from ..policy.systems import SYSTEMS
from ..provision.request import DEFAULT_DESIGNS
from ..workload.conversations import SHAPES
from ..workload.synthetic import SYNTHETIC


def split_and_unsplit_hardware(cat: Catalog) -> list[str]:
    """Machine kinds with a split and an unsplit design of only that kind (what `compare --hardware`
    takes)."""
    kinds: dict[str, set[bool]] = {}
    for d in cat.designs.values():
        used = set(d.kinds())
        if len(used) == 1:
            kinds.setdefault(used.pop(), set()).add(d.split)
    return [k for k, split in kinds.items() if split == {True, False}]


def help_lists(catalog: Catalog | None = None) -> dict[str, str]:
    """Each placeholder an option's help may hold, and its list."""
    cat = catalog or builtin_catalog()
    return {"{models}": ", ".join(cat.models), "{designs}": ", ".join(cat.designs),
            "{hardware}": ", ".join(cat.hardware),
            "{split_and_unsplit_hardware}": ", ".join(split_and_unsplit_hardware(cat)),
            "{default_designs}": ", ".join(DEFAULT_DESIGNS), "{workloads}": ", ".join((*SYNTHETIC, *SHAPES)),
            "{systems}": ", ".join(SYSTEMS), "{machine_schedulers}": ", ".join(SCHEDULERS),
            "{presets}": ", ".join(PRESETS)}


def fill(text: str, lists: dict[str, str]) -> str:
    for key, value in lists.items():
        text = text.replace(key, value)
    return text


HELPED = (typer.core.TyperOption, typer.core.TyperArgument)   # the parameters with a help text


class ListedHelp(typer.core.TyperCommand):
    """A command whose options' help holds `{models}`-style placeholders (help_lists)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._templates = {p.name: p.help for p in self.params if isinstance(p, HELPED) and p.help and "{" in p.help}
        self._fill(None)

    def _fill(self, catalog: Catalog | None) -> None:
        lists = help_lists(catalog)
        for p in self.params:
            if isinstance(p, HELPED) and p.name in self._templates:
                p.help = fill(self._templates[p.name], lists)

    def _user_catalog(self, ctx: typer.Context) -> Catalog | None:
        """The user catalog this run names (--catalog given before --help, or SPLITSERVE_CATALOG);
        None when it names none, or one that does not load (the run itself says why)."""
        directory = ctx.params.get("catalog")
        param = next((p for p in self.params if p.name == "catalog"), None)
        if directory is None and param is not None:
            directory = param.value_from_envvar(ctx)
        if not directory:
            return None
        try:
            return load_catalog(Path(directory))
        except (UserError, OSError):
            return None

    def format_help(self, ctx: Any, formatter: Any) -> None:  # click's Context: typer vendors it from 0.2x
        self._fill(self._user_catalog(ctx))
        super().format_help(ctx, formatter)
