"""The benchmarks' harness (bench/harness/): every bench script builds its command line and writes its
results through it, the results file has the documented schema, lanes interleave, the summaries are
right, and fleets built as objects round-trip through the one fleet writer (seconds; no benchmark is
run here beyond a tiny case)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import math
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import SCHEMA, Case, interleave, parse_list, ratio_summary, report_of, runs_of, stats  # noqa: E402
from bench.harness.results import median_interval  # noqa: E402

#: Bench scripts not on the harness yet, and why (bench/README.md, "The harness").
NOT_MOVED = {"codecs": "being changed in another branch", "round_bytes": "being changed in another branch"}
#: Programs in bench/ that are a lane of a benchmark, not a benchmark: started by it with its settings.
LANE_PROGRAMS = {"flwr_app": "vs_flower's and secagg_flower's Flower side, run in Flower's own environment"}


def scripts() -> list[str]:
    """The bench scripts: bench/*.py run as a command (``if __name__ == "__main__"``)."""
    return sorted(p.stem for p in (ROOT / "bench").glob("*.py") if '__name__ == "__main__"' in p.read_text())


MOVED = [s for s in scripts() if s not in NOT_MOVED and s not in LANE_PROGRAMS]


def test_the_lists_name_real_scripts():
    assert set(NOT_MOVED) | set(LANE_PROGRAMS) <= set(scripts()) and len(MOVED) >= 25


@pytest.mark.parametrize("name", MOVED)
def test_every_bench_script_is_a_case_of_the_harness(name):
    module = importlib.import_module(f"bench.{name}")
    case = module.CASE
    assert isinstance(case, Case), f"bench/{name}.py: CASE is not a bench.harness.Case"
    assert case.run is not None and callable(module.main)
    parser = case.parser()
    options = {o for action in parser._actions for o in action.option_strings}
    assert "--out" in options, f"bench/{name}.py: no --out from the harness"
    # The common options come from the harness only: a script declares them on its Case.
    declared = {"--repeats": case.repeats is not None, "--seeds": case.seeds is not None,
                "--data-root": case.data_root, "--quick": bool(case.quick)}
    assert {o for o, on in declared.items() if on} == options & set(declared), f"bench/{name}.py"
    assert set(case.quick) <= {a.dest for a in parser._actions}, f"bench/{name}.py: --quick sets unknown options"
    source = (ROOT / "bench" / f"{name}.py").read_text()
    assert "ArgumentParser(" not in source, f"bench/{name}.py builds its own parser"
    assert re.search(r"\b(ctx|context)\.write\(", source), f"bench/{name}.py writes no results through the harness"


@pytest.mark.slow  # imports every benchmark; the quick tier checks each Case
def test_every_script_answers_help_when_run_as_a_command(tmp_path):
    """Each script run as ``python bench/x.py --help`` (from another folder, nothing on PYTHONPATH, so it
    finds the repository itself), in one process so that torch is imported once."""
    code = (
        "import contextlib, io, json, runpy, sys\n"
        "out = {}\n"
        f"for name in {MOVED!r}:\n"
        f"    path = {str(ROOT / 'bench')!r} + '/' + name + '.py'\n"
        "    sys.argv, buf, code = [path, '--help'], io.StringIO(), None\n"
        "    with contextlib.redirect_stdout(buf):\n"
        "        try:\n"
        "            runpy.run_path(path, run_name='__main__')\n"
        "        except SystemExit as e:\n"
        "            code = e.code\n"
        "    out[name] = [code, buf.getvalue()]\n"
        "print(json.dumps(out))\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    helps = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in MOVED:
        code, text = helps[name]
        assert code in (0, None) and text.startswith("usage:"), f"bench/{name}.py --help: {code} {text[:300]}"
        assert "common benchmark options (bench/harness)" in text and "--out" in text, name


def tiny(ctx):
    """A case with two lanes side by side: each run's value is known, so are the summaries."""
    values = {"a": [1.0, 2.0, 3.0], "b": [2.0, 4.0, 9.0]}
    runs = [{"lane": lane, "repeat": rep, "seconds": values[lane][rep], "seed": ctx.seeds[0]}
            for rep, lane in interleave(("a", "b"), ctx.repeats)]
    return ctx.write(runs, {"note": "tiny"}, {"over_a": ratio_summary(runs, "seconds", "a")}, quiet=True)


TINY = Case("tiny", "A tiny case.\n\nMore.", tiny, repeats=3, seeds="7", data_root=True, quick={"repeats": 2},
            metrics=("seconds",), group_by=("lane",), script="tests/test_bench_harness.py")


def test_the_results_file_has_the_documented_schema(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGETRAIN_DATA", raising=False)
    out = tmp_path / "tiny.json"
    TINY.main(["--out", str(out), "--data-root", str(tmp_path)])
    doc = json.loads(out.read_text())
    assert list(doc) == ["schema", "case", "command", "options", "machine", "date", "commit", "dirty", "wall_s",
                         "runs", "summary", "report"]
    assert doc["schema"] == SCHEMA and doc["case"] == "tiny"
    assert doc["command"] == f"python tests/test_bench_harness.py --out {out} --data-root {tmp_path}"
    assert doc["options"]["repeats"] == 3 and doc["options"]["seeds"] == "7" and doc["options"]["out"] == str(out)
    assert doc["options"]["data_root"] == str(tmp_path.resolve())
    machine = doc["machine"]
    assert machine["cores"] >= 1 and machine["memory_gib"] > 0 and machine["cpu"] and machine["python"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", doc["date"])
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert doc["commit"] == head and isinstance(doc["dirty"], bool)
    # Runs: every lane once a repeat, the first lane rotating.
    assert [(r["repeat"], r["lane"]) for r in doc["runs"]] == [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"),
                                                               (2, "b")]
    assert all(r["seed"] == 7 for r in doc["runs"])
    by_lane = {row["lane"]: row for row in doc["summary"]["seconds"]}
    assert by_lane["a"]["n"] == 3 and by_lane["a"]["median"] == 2.0 and by_lane["b"]["median"] == 4.0
    assert (by_lane["b"]["min"], by_lane["b"]["max"], by_lane["b"]["q1"], by_lane["b"]["q3"]) == (2.0, 9.0, 3.0, 6.5)
    assert by_lane["a"]["interval"] is None  # too few runs for a 95% interval of the median
    (over,) = doc["summary"]["over_a"]  # b / a paired by repeat: 2, 2, 3
    assert over["lane"] == "b" and over["median"] == 2.0 and over["max"] == 3.0
    assert doc["report"] == {"note": "tiny"} and report_of(doc) == {"note": "tiny"} and runs_of(doc) == doc["runs"]
    # A given --data-root reaches the run's children as $EDGETRAIN_DATA.
    assert __import__("os").environ["EDGETRAIN_DATA"] == str(tmp_path.resolve())


def test_quick_is_the_smallest_run_and_given_options_win(tmp_path):
    assert TINY.parse(["--quick"]).repeats == 2
    assert TINY.parse(["--quick", "--repeats", "3"]).repeats == 3
    assert TINY.parse([]).repeats == 3 and TINY.parse([]).out.name == "tiny.json"
    assert "works: --repeats 2 (given options win)" in " ".join(TINY.parser().format_help().split())


def test_a_real_script_writes_the_schema_in_its_smallest_form(tmp_path):
    out = tmp_path / "secagg.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "secagg.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == SCHEMA and doc["case"] == "secagg" and doc["options"]["devices"] == "5"
    assert [(r["devices"], r["dropout"]) for r in doc["runs"]] == [(5, 0.0), (5, 0.2)]
    assert all(r["secure"]["revealed"] == 4 for r in doc["runs"])  # every block unmasked, dropout or not


def test_older_results_files_still_read():
    old = {"rows": [1], "runs": [{"x": 1}]}
    assert report_of(old) == old and runs_of(old) == [{"x": 1}] and runs_of({"results": [2]}, "results") == [2]


def test_median_interval_is_the_binomial_order_statistics():
    assert median_interval([1, 2, 3, 4, 5]) is None  # P(all on one side) = 1/16 > 2.5%
    assert median_interval(range(1, 7)) == (1, 6)  # n = 6: x(1), x(6) (coverage 96.9%)
    assert median_interval(range(1, 11)) == (2, 9)  # n = 10: x(2), x(9) (coverage 97.9%)
    assert median_interval(range(1, 101)) == (40, 61)  # n = 100: ranks 40 and 61
    s = stats([3.0, float("nan"), 1.0, None, 2.0])  # non-numbers and NaN left out
    assert s["n"] == 3 and s["median"] == 2.0 and stats([]) == {"n": 0}


def test_interleave_rotates_and_parse_list_types():
    assert list(interleave(["x", "y", "z"], 2)) == [(0, "x"), (0, "y"), (0, "z"), (1, "y"), (1, "z"), (1, "x")]
    assert list(interleave(["x", "y"], 2, rotate=False)) == [(0, "x"), (0, "y"), (1, "x"), (1, "y")]
    assert parse_list("0, 1,,2", int) == [0, 1, 2] and parse_list([0.5, "1"], float) == [0.5, 1.0]


# -- fleets ----------------------------------------------------------------------------------------------
def test_every_shipped_fleet_round_trips_through_the_one_writer():
    from bench.harness.fleets import fleet_toml
    from emulator import fleet_names, load_fleet, parse_fleet

    for name in fleet_names():
        fleet = load_fleet(name)
        again = parse_fleet(tomllib.loads(fleet_toml(fleet)), default_name=name)
        assert dataclasses.replace(again, path=None) == dataclasses.replace(fleet, path=None), name


def test_a_fleet_is_built_validated_and_derived_as_an_object():
    from bench.harness.fleets import build_fleet, derive, fleet_tables, group, same_fleet, fleet_toml
    from emulator import FleetError

    fleet = build_fleet("t", model="mnist_2nn", dataset="mnist", seed=3,
                        training={"strategy": "fedavg", "rounds": 2, "norm_bound": 0.0},
                        emulation={"mode": "lightweight"}, behaviour={"dropout": 0.1},
                        groups=[group("mid-phone", 4, "a"), group("mid-phone", 2, "b", force_split=1)])
    assert fleet.num_devices == 6 and fleet.partition.seed == 3 and fleet.training.norm_bound == 0.0
    assert [g.behaviour.dropout for g in fleet.groups] == [0.1, 0.1]
    tables = fleet_tables(fleet)
    assert tables["training"]["local_steps"] == fleet.training.local_steps  # the workload's numbers always stated
    moved = derive(fleet, fleet={"seed": 5}, training={"norm_bound": None})
    assert moved.seed == 5 and moved.partition.seed == 5  # a partition following the seed keeps following it
    assert moved.training.norm_bound == type(fleet.training)().norm_bound  # back to the server's default
    assert same_fleet(fleet_toml(fleet), fleet_toml(derive(fleet, fleet={"name": "other"})))
    assert not same_fleet(fleet_toml(fleet), fleet_toml(moved))
    with pytest.raises(FleetError, match="groups\\[0\\].colour"):
        build_fleet("t", model="mnist_2nn", groups=[group("mid-phone", 1, colour="red")])


def test_the_fleet_writer_writes_toml_values_exactly():
    from bench.harness.fleets import _value

    data = {"s": 'a "quoted"\\ line\n', "f": 1e-4, "i": 3, "b": False, "l": [1, 2], "t": {"k-1": 0.5}}
    text = "\n".join(f"{k} = {_value(v)}" for k, v in data.items())
    assert tomllib.loads(text) == data
    assert math.isinf(tomllib.loads(f"x = {_value(float('inf'))}")["x"])


# -- guards ----------------------------------------------------------------------------------------------
def bench_sources() -> dict[str, str]:
    """The bench's own sources (not Flower's environment, bench/.venv-flwr, that vs_flower makes there)."""
    return {p.stem: p.read_text() for p in sorted((ROOT / "bench").rglob("*.py"))
            if p.stem not in NOT_MOVED and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)}


def test_no_bench_script_writes_fleet_toml_by_hand():
    for name, source in bench_sources().items():
        assert not re.search(r"^\s*\[\[?(fleet|groups|training|emulation)\]\]?\s*$", source, re.M), \
            f"bench/{name}.py writes fleet TOML text: build the fleet (bench.harness.fleets) instead"


def test_no_bench_script_imports_a_private_name():
    for name, source in bench_sources().items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module and not node.module.startswith("bench"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"bench/{name}.py imports {private} from {node.module}"
