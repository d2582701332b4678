"""Every list in `--help` comes from the catalog and the registries (cli/lists.py), so none can go
stale: the built-in models (mixtral-8x7b among them), a user catalog's own model
(SPLITSERVE_CATALOG, or --catalog before --help), the serving systems, machine schedulers, designs
and workloads."""

from __future__ import annotations

import tomllib
from importlib import resources

import pytest

from splitserve.catalog import builtin_catalog
from splitserve.cli import main
from splitserve.policy.cluster_schedulers import CLUSTER_SCHEDULERS
from splitserve.policy.predictor import PRESETS as PREDICTORS
from splitserve.policy.schedulers import SCHEDULERS
from splitserve.policy.systems import SYSTEMS
from splitserve.workload.synthetic import SYNTHETIC


def help_text(capsys, monkeypatch, *args) -> str:
    monkeypatch.setenv("COLUMNS", "400")       # one option a line: no name broken by the wrapping
    assert main([*args, "--help"]) == 0
    out = capsys.readouterr().out
    return " ".join(out.replace("│", " ").split())


def user_catalog(tmp_path) -> str:
    """A catalog directory whose models.toml adds llama2-70b's entry under a new name."""
    models = tomllib.loads(resources.files("splitserve.catalog").joinpath("models.toml").read_text())
    entry = "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in models["llama2-70b"].items()
                      if not isinstance(v, dict))
    (tmp_path / "models.toml").write_text(f"[my-llama-70b]\n{entry}\n")
    return str(tmp_path)


def test_simulate_help_lists_every_built_in_model_and_design(capsys, monkeypatch):
    monkeypatch.delenv("SPLITSERVE_CATALOG", raising=False)
    text = help_text(capsys, monkeypatch, "simulate")
    assert "mixtral-8x7b" in text
    for name in [*builtin_catalog().models, *builtin_catalog().designs, *SYNTHETIC]:
        assert name in text, name
    assert "my-llama-70b" not in text


def test_a_user_catalogs_model_shows_in_simulate_help(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SPLITSERVE_CATALOG", user_catalog(tmp_path))
    text = help_text(capsys, monkeypatch, "simulate")
    assert "opt-175b, mixtral-8x7b, my-llama-70b (catalog/models.toml)" in text


def test_catalog_before_help_lists_its_models(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("SPLITSERVE_CATALOG", raising=False)
    for command in ("simulate", "provision", "compare"):
        assert "my-llama-70b" in help_text(capsys, monkeypatch, command, "--catalog", user_catalog(tmp_path))


@pytest.mark.parametrize("command, names", [("provision", SCHEDULERS), ("provision", SYSTEMS),
                                            ("compare", SYSTEMS), ("bench", SYNTHETIC), ("simulate", SYSTEMS),
                                            ("serve", SYSTEMS), ("simulate", CLUSTER_SCHEDULERS),
                                            ("simulate", PREDICTORS)])
def test_registries_are_listed(capsys, monkeypatch, command, names):
    text = help_text(capsys, monkeypatch, command)
    assert ", ".join(names) in text


def test_every_machine_scheduler_is_in_the_policy_options_help(capsys, monkeypatch):
    """--machine-scheduler names each scheduler of the registry with its own line (`about`)."""
    text = help_text(capsys, monkeypatch, "serve")
    for name, s in SCHEDULERS.items():
        assert (f"{name} ({s.about})" if s.about else name) in text, name
