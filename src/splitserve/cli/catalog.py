"""The `--catalog DIR` option that simulate, provision and compare share: its help text, and the
user catalog loaded with a warning line for each entry that replaces a built-in one."""

from __future__ import annotations

from pathlib import Path

import typer

from ..catalog import Catalog, load_catalog

CATALOG_HELP = ("A directory of your own hardware.toml, models.toml, designs.toml, kv_transfer.toml (any of "
                "them, the built-in files' format): its entries are added to the built-in ones, or replace "
                "the one of the same name (with a warning).")


def catalog_option(extra: str = ""):
    """The option (SPLITSERVE_CATALOG when not given; eager, so that `--catalog DIR --help` lists
    its entries: cli/lists.py)."""
    return typer.Option(envvar="SPLITSERVE_CATALOG", is_eager=True, help=CATALOG_HELP + extra)


def user_catalog(directory: Path | None) -> Catalog | None:
    """The catalog with the user's directory on top (None: the built-in one); a warning line for
    each entry that replaces a built-in one."""
    if directory is None:
        return None
    cat = load_catalog(directory)
    for entry in cat.replaced:
        typer.echo(f"warning: catalog {entry} replaces the built-in entry of that name", err=True)
    return cat
