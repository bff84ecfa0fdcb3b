"""The device side stays lean: importing it loads neither torch nor onnx.

Each check runs in a fresh interpreter, since this test process has torch loaded already.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

from edge_sdk.models import build_model
from profiles.accounting import measure_model

HEAVY = ("torch", "onnx")


def run_fresh(code: str, stdin: str = "") -> dict:
    """Run ``code`` in a new interpreter; it prints a JSON object as its last line."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], input=stdin, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def loaded_heavy_modules(modules: list[str]) -> list[str]:
    code = f"""
        import importlib, json, sys
        for name in {modules!r}:
            importlib.import_module(name)
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
        print(json.dumps({{"heavy": heavy}}))
    """
    return run_fresh(code)["heavy"]


def test_edge_sdk_imports_without_torch_or_onnx():
    modules = ["edge_sdk"]
    if importlib.util.find_spec("edge_sdk.protocol") is not None:
        modules.append("edge_sdk.protocol")
    assert loaded_heavy_modules(modules) == []


def test_the_device_side_of_profiles_imports_without_torch_or_onnx():
    modules = ["profiles.units", "profiles.probe", "profiles.runtime", "profiles.devices",
               "profiles.accounting", "profiles.planner"]
    assert loaded_heavy_modules(modules) == []


def test_a_device_probes_and_plans_without_torch():
    """Given a model's cost as plain data (as a server could send it), a device without torch
    probes itself and plans its own split."""
    cost = measure_model(build_model("resnet20")).to_dict()
    code = """
        import json, sys
        from profiles.accounting import ModelCost
        from profiles.devices import load_device_class
        from profiles.planner import plan_split
        from profiles.probe import probe

        cost = ModelCost.from_dict(json.load(sys.stdin))
        machine = probe()
        plan = plan_split(cost, load_device_class("pi-3b").budget_bytes, 32, runtime=300 * 2**20)
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "onnx"))
        print(json.dumps({"heavy": heavy, "split": plan.split, "cores": machine.cores}))
    """
    seen = run_fresh(code, stdin=json.dumps(cost))
    assert seen["heavy"] == []
    assert seen["cores"] >= 1
    assert 0 <= seen["split"] < len(cost["blocks"])


def test_only_measuring_a_model_loads_torch():
    code = """
        import json, sys
        import profiles.accounting
        before = "torch" in sys.modules
        from edge_sdk.models import build_model
        profiles.accounting.measure_model(build_model("tiny"))
        print(json.dumps({"before": before, "after": "torch" in sys.modules}))
    """
    assert run_fresh(code) == {"before": False, "after": True}


def test_an_emulated_device_process_loads_no_server_and_no_torch_at_import():
    """Device processes and lightweight workers import the emulation's device side only: what a
    device holds is what is measured against its budget."""
    code = """
        import json, sys
        import emulator.device, emulator.lightweight
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "onnx", "typer", "rich")
                        or m in ("orchestrator.server.orchestrator", "edgetrain.cli", "emulator.localfleet"))
        print(json.dumps({"loaded": loaded}))
    """
    assert run_fresh(code)["loaded"] == []
