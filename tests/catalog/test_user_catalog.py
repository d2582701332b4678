"""A user catalog (`--catalog DIR`): entries added to or replacing the built-in ones, checked by the
same code, and the figures of a run moving exactly as the changed fields say."""

import json
import pickle
import tomllib
from dataclasses import replace
from importlib import resources

import pytest

from splitserve.catalog import (
    builtin_catalog,
    kv_capacity_tokens,
    load_catalog,
    load_hardware,
)
from splitserve.catalog.checks import Where, hardware_entry
from splitserve.cli import main
from splitserve.errors import UserError
from splitserve.sim.run import run_simulation

BUILTIN = {f: tomllib.loads(resources.files("splitserve.catalog").joinpath(f).read_text())
           for f in ("hardware.toml", "models.toml")}
RUN = ["simulate", "--duration", "20", "--rps", "4", "--json", "--quiet"]


def table(name: str, values: dict) -> str:
    """TOML text of one entry (a nested table, such as a machine's roofline, as [name.key])."""
    def value(v):
        return json.dumps(v) if isinstance(v, str) else repr(v)

    flat = [f"{k} = {value(v)}" for k, v in values.items() if not isinstance(v, dict)]
    out = f"[{name}]\n" + "\n".join(flat) + "\n"
    for k, v in values.items():
        if isinstance(v, dict):
            out += table(f"{name}.{k}", v)
    return out


def h100(**changes) -> dict:
    return {**BUILTIN["hardware.toml"]["dgx-h100"], **changes}


def write(tmp_path, **files) -> str:
    for name, text in files.items():
        (tmp_path / f"{name}.toml").write_text(text)
    return str(tmp_path)


def simulate(capsys, *args):
    code = main([*RUN, *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out), err


def test_a_cheaper_h100_changes_the_cost_by_the_price_ratio_and_nothing_else(tmp_path, capsys):
    cat = write(tmp_path,
                hardware=table("h100-cheap", h100(cost_per_hour=19.0)),
                designs=table("splitwise-cheap", {"scheduler": "splitwise", "prompt": "h100-cheap",
                                                  "token": "h100-cheap"}),
                kv_transfer="[overhead_s]\nh100-cheap = 4.9e-3\n")   # dgx-h100's transfer overhead
    ours, err = simulate(capsys, "--catalog", cat, "--design", "splitwise-cheap")
    theirs, _ = simulate(capsys, "--design", "splitwise-hh")
    assert err == ""                                     # added, nothing replaced: no warning
    assert ours["cluster"]["cost_per_hour"] == 5 * 19.0 == 95.0     # 4P + 1T at $19/h
    assert theirs["cluster"]["cost_per_hour"] == 5 * 38.0 == 190.0
    assert ours["cluster"]["cost_per_1k_requests"] == pytest.approx(theirs["cluster"]["cost_per_1k_requests"] / 2)
    for key in ("requests", "completed", "throughput_rps", "ttft_s", "tbt_s", "e2e_s", "slo", "kv_transfer"):
        assert ours[key] == theirs[key], key             # the same machine at another price
    assert ours["cluster"]["power_kw"] == theirs["cluster"]["power_kw"] == 5 * 5.6
    assert ours["catalog"]["source"] == cat and len(ours["catalog"]["fingerprint"]) == 64
    assert ours["config"]["catalog"] == cat and "catalog" not in theirs


def test_kv_transfer_overheads_come_from_the_catalog(tmp_path):
    from splitserve.sim.kv_transfer import link_between

    bare = load_catalog(write(tmp_path, hardware=table("h100-cheap", h100())))
    cheap = bare.hardware["h100-cheap"]
    assert link_between(cheap, cheap, catalog=bare).overhead == 0.0          # none given: none
    h = load_hardware("dgx-h100")
    assert link_between(h, h, catalog=bare).overhead == link_between(h, h).overhead == 4.9e-3
    assert link_between(cheap, h, catalog=bare).overhead == 4.9e-3           # a pair: the larger
    (tmp_path / "kv_transfer.toml").write_text("[overhead_s]\nh100-cheap = 2e-3\ndgx-h100 = 1e-3\n")
    cat = load_catalog(str(tmp_path))
    assert link_between(cheap, cheap, catalog=cat).overhead == 2e-3
    assert link_between(h, h, catalog=cat).overhead == 1e-3                  # replaced
    assert link_between(cheap, cheap, catalog=cat).bandwidth == 50e9         # ib_gbs, as dgx-h100's
    assert cat.replaced == (f"{tmp_path / 'kv_transfer.toml'} [overhead_s] dgx-h100",)


def test_a_model_in_fp8_holds_twice_the_kv_by_hand(tmp_path):
    fp8 = {**BUILTIN["models.toml"]["llama2-70b"], "dtype_bytes": 1}
    cat = load_catalog(write(tmp_path, models=table("llama2-70b-fp8", fp8)))
    m, hw = cat.model("llama2-70b-fp8"), cat.hardware_spec("dgx-h100")
    # 8 x 80 GB x 0.9 = 576e9 usable; weights 68,976,648,192 x 1 byte; reserve 8 GPUs x 4,096 tokens x
    # (2 x 8192 + (64 + 2 x 8) x 128 / 8 + 2 x 28672 / 8) x 1 byte = 813,694,976;
    # KV per token 2 x 80 x 8 x 128 x 1 = 163,840 bytes
    assert (576e9 - 68_976_648_192 - 813_694_976) // 163_840 == 3_089_658
    assert kv_capacity_tokens(m, hw) == 3_089_658
    _, res = run_simulation(design="baseline-h100", machines=1, model="llama2-70b-fp8", rps=1.0, duration=5.0,
                            catalog=cat, return_result=True)
    assert [st.kv_capacity for st in res.metrics.machines] == [3_089_658]
    with pytest.raises(UserError, match="unknown model 'llama2-70b-fp8'"):
        run_simulation(design="baseline-h100", machines=1, model="llama2-70b-fp8", rps=1.0, duration=5.0)


def test_an_entry_of_the_same_name_replaces_the_built_in_one_with_a_warning(tmp_path, capsys):
    cat_dir = write(tmp_path, hardware=table("dgx-h100", h100(cost_per_hour=19.0)))
    ours, err = simulate(capsys, "--catalog", cat_dir)
    assert err == f"warning: catalog {tmp_path / 'hardware.toml'} [dgx-h100] replaces the built-in entry of that name\n"
    assert ours["cluster"]["cost_per_hour"] == 95.0      # splitwise-hh now on the user's dgx-h100
    cat = load_catalog(cat_dir)
    assert cat.replaced == (f"{tmp_path / 'hardware.toml'} [dgx-h100]",)
    # the machines whose roofline was fitted on dgx-h100 refer to the user's machine now
    assert cat.hardware["dgx-h200"].roofline.fitted_ref.cost_per_hour == 19.0
    assert builtin_catalog().hardware["dgx-h200"].roofline.fitted_ref.cost_per_hour == 38.0
    assert load_hardware("dgx-h100").cost_per_hour == 38.0   # the built-in catalog is untouched


def test_the_environment_variable_names_the_catalog(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPLITSERVE_CATALOG", write(tmp_path, hardware=table("dgx-h100", h100(cost_per_hour=19.0))))
    ours, err = simulate(capsys)
    assert ours["cluster"]["cost_per_hour"] == 95.0 and "replaces the built-in entry" in err


BAD = [
    ("hardware", table("h100-x", h100(cost_per_hour=-1.0)), "[h100-x] cost_per_hour: must be >= 0, got -1.0"),
    ("hardware", table("h100-x", h100(gpus="8")), "[h100-x] gpus: must be an integer, got '8' (str)"),
    ("hardware", table("h100-x", h100(gpus=8.0)), "[h100-x] gpus: must be an integer, got 8.0 (float)"),
    ("hardware", table("h100-x", {k: v for k, v in h100().items() if k != "hbm_gb"}), "[h100-x] hbm_gb: missing"),
    ("hardware", table("h100-x", h100(hbm=80.0)), "[h100-x] hbm: unknown field (fields: bf16_tflops, cost_per_hour,"),
    ("hardware", table("h100-x", h100(power_kw=5.0)),
     "[h100-x] power_kw: 5.0 != gpus * gpu_tdp_w * machine_power_frac / 1000 = 5.6"),
    ("hardware", table("h100-x", h100(roofline={**h100()["roofline"], "mbu": 1.5})),
     "[h100-x.roofline] mbu: must be in (0, 1], got 1.5"),
    ("hardware", table("h100-x", h100(roofline={**h100()["roofline"], "fitted_on": "dgx-h200"})),
     "[h100-x.roofline] fitted_on: 'dgx-h200' must name a machine with its own fit and the same GPU count"),
    ("models", table("m", {**BUILTIN["models.toml"]["llama2-70b"], "layers": 0}), "[m] layers: must be >= 1, got 0"),
    ("models", table("m", {**BUILTIN["models.toml"]["llama2-70b"], "experts_per_token": 2}),
     "[m] experts_per_token: need 1 <= experts_per_token (2) <= experts (1)"),
    ("designs", table("d", {"scheduler": "mixed", "machine": "dgx-z"}),
     "[d] machine: unknown hardware 'dgx-z'; valid names: dgx-a100, dgx-h100, dgx-h100-cap, dgx-h200, dgx-l40s"),
    ("designs", table("d", {"scheduler": "mixed", "prompt": "dgx-h100", "machine": "dgx-h100"}),
     "[d] prompt: not a field of a mixed design (it names machine)"),
    ("kv_transfer", "[overhead_s]\ndgx-h100 = -1.0\n", "[overhead_s] dgx-h100: must be >= 0, got -1.0"),
]


@pytest.mark.parametrize("name, text, expect", BAD)
def test_a_bad_entry_is_one_error_line_naming_file_entry_and_field(tmp_path, capsys, name, text, expect):
    write(tmp_path, **{name: text})
    code = main([*RUN, "--catalog", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith(f"error: catalog {tmp_path / (name + '.toml')}: {expect}")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_user_entry_gets_the_built_in_entries_checks():
    """The built-in hardware.toml goes through `checks.hardware_entry` as a user's does: the same table
    broken the same way gets the same error, but for the file's name."""
    bad = h100(gpus="8")
    errors = []
    for file in ("splitserve/catalog/hardware.toml", "/home/me/cat/hardware.toml"):
        with pytest.raises(UserError) as e:
            hardware_entry(Where(file), "dgx-h100", bad)
        errors.append(str(e.value).replace(file, "FILE"))
    assert errors[0] == errors[1] == "catalog FILE: [dgx-h100] gpus: must be an integer, got '8' (str)"


def test_a_catalog_directory_holds_only_catalog_files(tmp_path, capsys):
    assert main([*RUN, "--catalog", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == f"error: catalog {tmp_path / 'none'}: not a directory\n"
    assert main([*RUN, "--catalog", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"error: catalog {tmp_path}: holds none of hardware.toml, models.toml, "
                                       "designs.toml, kv_transfer.toml\n")
    (tmp_path / "hardwares.toml").write_text("")
    assert main([*RUN, "--catalog", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"error: catalog {tmp_path}: unknown file hardwares.toml (a catalog holds "
                                       "hardware.toml, models.toml, designs.toml, kv_transfer.toml)\n")
    (tmp_path / "hardwares.toml").unlink()
    (tmp_path / "models.toml").write_text("[m\n")
    assert main([*RUN, "--catalog", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: catalog {tmp_path / 'models.toml'}: not valid TOML: ")


def test_a_catalog_is_a_plain_value_equal_by_its_files(tmp_path):
    d = write(tmp_path, hardware=table("h100-cheap", h100(cost_per_hour=19.0)))
    a, b = load_catalog(d), load_catalog(d)
    assert a == b and hash(a) == hash(b) and a != builtin_catalog()
    c = pickle.loads(pickle.dumps(a))                  # it can travel to a worker process
    assert c == a and c.hardware["h100-cheap"] == a.hardware["h100-cheap"]
    (tmp_path / "hardware.toml").write_text(table("h100-cheap", h100(cost_per_hour=20.0)))
    assert load_catalog(d) != a                        # other content, another fingerprint
    assert load_catalog(None) is builtin_catalog()


def test_provision_searches_a_user_design_and_prices_it_from_the_user_catalog(tmp_path, capsys):
    (tmp_path / "cat").mkdir()
    cat = write(tmp_path / "cat",
                hardware=table("h100-cheap", h100(cost_per_hour=19.0)),
                designs=table("splitwise-cheap", {"scheduler": "splitwise", "prompt": "h100-cheap",
                                                  "token": "h100-cheap"}),
                kv_transfer="[overhead_s]\nh100-cheap = 4.9e-3\n")
    args = ["provision", "--catalog", cat, "--objective", "cost", "--rps", "4", "--duration", "20",
            "--max-prompt", "4", "--max-token", "4", "--design", "splitwise-cheap", "--design", "splitwise-hh",
            "--workers", "2", "--cache-dir", str(tmp_path / "cache"), "--json", "--quiet"]
    assert main(args) == 0
    res = json.loads(capsys.readouterr().out)
    cheap, hh = res["designs"]
    # the same machine at half the price: the same cluster (the jobs ran in worker processes, so
    # the catalog travelled with them), at half the cost, and the search picks it
    assert (cheap["prompt_machines"], cheap["token_machines"]) == (hh["prompt_machines"], hh["token_machines"])
    assert cheap["cost_per_hour"] == 19.0 * (cheap["prompt_machines"] + cheap["token_machines"])
    assert hh["cost_per_hour"] == 38.0 * (hh["prompt_machines"] + hh["token_machines"])
    assert res["best"]["design"] == "splitwise-cheap"
    assert res["catalog"]["source"] == cat and res["config"]["catalog"] == cat
    # without --catalog the design is unknown: one error line
    assert main([a for a in args if a not in ("--catalog", cat)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: unknown design 'splitwise-cheap'")


def test_a_user_catalog_is_part_of_the_provision_cache_key(tmp_path):
    from splitserve.provision.evaluate import Cache, Job
    d = write(tmp_path, hardware=table("dgx-h100", h100(cost_per_hour=19.0)))
    job = Job("splitwise-hh", 2, 1, None, 4.0)
    cache = Cache(tmp_path / "cache")
    user = cache.key(replace(job, catalog=load_catalog(d)))
    assert user != cache.key(job)                     # a replaced entry never reads the built-in's result
    (tmp_path / "hardware.toml").write_text(table("dgx-h100", h100(cost_per_hour=20.0)))
    assert cache.key(replace(job, catalog=load_catalog(d))) != user   # nor an edited file's
    assert cache.key(replace(job, catalog=load_catalog(d))) == cache.key(replace(job, catalog=load_catalog(d)))


def provision_json(capsys, *args) -> dict:
    assert main(["provision", *args, "--workers", "2", "--no-cache", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_configuration_search_prices_replicas_from_the_user_catalog(tmp_path, capsys):
    a100 = BUILTIN["hardware.toml"]["dgx-a100"]
    cat = write(tmp_path, hardware=table("dgx-a100", {**a100, "cost_per_hour": a100["cost_per_hour"] / 2}))
    args = ["--objective", "capacity-per-dollar", "--tps", "4,8", "--schedulers", "vllm,splitwise",
            "--batch-caps", "0", "--duration", "20", "--min-rps", "0.05"]
    ours, theirs = provision_json(capsys, "--catalog", cat, *args), provision_json(capsys, *args)
    assert ours["catalog"]["replaced"] == [f"{cat}/hardware.toml [dgx-a100]"] and "catalog" not in theirs
    rows = list(zip(ours["designs"][0]["configs"], theirs["designs"][0]["configs"]))
    assert len(rows) == 6 and sum(a["capacity_rps"] is not None for a, _ in rows) == 3
    for a, b in rows:   # the same capacities (the jobs ran in worker processes), at half the price
        assert (a["label"], a["capacity_rps"]) == (b["label"], b["capacity_rps"])
        assert a["cost_per_hour"] == b["cost_per_hour"] / 2 == a100["cost_per_hour"] / 16 * a["gpus"]
        if a["capacity_rps"] is not None:
            assert a["capacity_per_dollar"] == pytest.approx(2 * b["capacity_per_dollar"])


def test_the_placement_search_runs_a_user_model(tmp_path, capsys):
    models = tomllib.loads(resources.files("splitserve.catalog").joinpath("models.toml").read_text())
    cat = write(tmp_path, models=table("opt-13b-mine", models["opt-13b"]))
    args = ["--objective", "goodput-per-gpu", "--placement", "low-affinity", "--goodput-ttft", "0.2",
            "--goodput-tpot", "0.1", "--rps", "2", "--workload", "sharegpt", "--nodes", "1",
            "--probe-requests", "50"]
    ours = provision_json(capsys, "--catalog", cat, "--model", "opt-13b-mine", *args)
    theirs = provision_json(capsys, "--model", "opt-13b", *args)
    # a copy of opt-13b under another name: the very placement and goodputs of the built-in one
    same = lambda r: {k: v for k, v in r.items() if k not in ("model", "search", "config", "catalog")}  # noqa: E731
    assert same(ours) == same(theirs) and ours["search"]["simulated"] == theirs["search"]["simulated"] > 10
    assert ours["catalog"]["source"] == cat
    assert main(["provision", "--model", "opt-13b-mine", *args]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: unknown model 'opt-13b-mine'")


def test_compare_runs_on_a_user_machine_kind_and_prices_the_budget_from_it(tmp_path, capsys):
    (tmp_path / "cat").mkdir()
    cat = write(tmp_path / "cat",
                hardware=table("h100-cheap", h100(cost_per_hour=19.0)),
                designs=table("splitwise-cheap", {"scheduler": "splitwise", "prompt": "h100-cheap",
                                                  "token": "h100-cheap"})
                + table("baseline-cheap", {"scheduler": "mixed", "machine": "h100-cheap"}),
                kv_transfer="[overhead_s]\nh100-cheap = 4.9e-3\n")
    common = ["-n", "3", "--duration", "20", "--tolerance", "0.1", "--curve-points", "0", "--system", "vllm",
              "--system", "splitwise", "--workers", "2", "--no-cache", "--quiet"]
    assert main(["compare", "--catalog", cat, "--hardware", "h100-cheap", "--out", str(tmp_path / "ours"),
                 *common]) == 0
    assert main(["compare", "--out", str(tmp_path / "builtin"), *common]) == 0
    capsys.readouterr()
    ours, theirs = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("ours", "builtin"))
    assert ours["budget"] == {**theirs["budget"], "hardware": "h100-cheap", "cost_per_hour": 3 * 19.0,
                              "split_design": "splitwise-cheap", "unsplit_design": "baseline-cheap"}
    assert theirs["budget"]["cost_per_hour"] == 3 * 38.0
    assert ours["catalog"]["source"] == cat and "catalog" not in theirs
    # the same machine at half the price: the same goodputs and splits (the searches ran in worker
    # processes, so the catalog travelled with them), at half the cost per output token
    for a, b in zip(ours["systems"], theirs["systems"]):
        assert (a["system"], a["goodput_rps"], a["cluster"]) == (b["system"], b["goodput_rps"], b["cluster"])
        assert a["goodput_rps"] is not None
        assert a["at_goodput"]["cost_per_hour"] == 3 * 19.0
        assert a["at_goodput"]["cost_per_m_output_tokens"] == pytest.approx(
            b["at_goodput"]["cost_per_m_output_tokens"] / 2)
    # without --catalog the machine kind is unknown: one error line
    assert main(["compare", "--hardware", "h100-cheap", "--out", str(tmp_path / "x"), *common]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: unknown hardware 'h100-cheap'")
