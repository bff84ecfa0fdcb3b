"""The device's entry point ships with the device SDK: ``python -m edge_sdk`` (and ``edgetrain device``,
which adds device classes) runs a real device, imports nothing outside ``edge_sdk``, and carries no
fault-injection options (those belong to ``python -m emulator.device``)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from edge_sdk.payload_store import payload_folder
from emulator.localfleet import device_env, start_orchestrator
from orchestrator.config import ServerConfig
from orchestrator.store import Store
from profiles.devices import load_device_class

REPO = Path(__file__).resolve().parents[1]
FAULT_OPTIONS = ("--drop-rounds", "--drop-prob", "--cut-download-rounds", "--cut-upload-rounds", "--delay",
                 "--force-split")


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_the_entry_point_imports_only_the_device_sdk() -> None:
    code = ("import sys, edge_sdk.cli\n"
            "outside = {'torch', 'onnx', 'onnxruntime', 'orchestrator', 'profiles', 'exporters', 'typer', 'rich'}\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & outside))\n")
    out = _run("-c", code)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_production_options_only() -> None:
    device = _run("-m", "edge_sdk", "--help")
    wrapper = _run("-m", "edgetrain", "device", "--help")
    assert device.returncode == wrapper.returncode == 0, device.stderr + wrapper.stderr
    for option in ("--server", "--id", "--budget", "--data", "--client", "--num-clients", "--json-events", "--token",
                   "--tls-ca", "--threads", "--storage", "--data-root", "--data-limit", "--partition", "--seed",
                   "--reconnect-retries"):
        assert option in device.stdout and option in wrapper.stdout, option
    assert "--device-class" not in device.stdout and "--device-class" in wrapper.stdout
    for option in FAULT_OPTIONS:
        assert option not in device.stdout and option not in wrapper.stdout, option


def test_usage_errors_are_reported_as_such() -> None:
    bad = _run("-m", "edge_sdk", "--id", "d", "--budget", "lots")
    assert bad.returncode == 2 and "--budget" in bad.stderr
    bad = _run("-m", "edge_sdk", "--id", "d", "--client", "3", "--num-clients", "2")
    assert bad.returncode == 2 and "client 3 outside [0, 2)" in bad.stderr
    bad = _run("-m", "edgetrain", "device", "--id", "d", "--device-class", "toaster")
    assert bad.returncode == 2 and "unknown device class" in bad.stderr


@pytest.mark.slow
def test_both_entry_points_train_with_an_orchestrator(tmp_path: Path) -> None:
    config = ServerConfig(model="digits_mlp", rounds=1, min_devices=2, local_steps=2, store_dir=tmp_path / "store",
                          deadline_s=90)

    async def run() -> tuple[list[dict], list[int], list[str]]:
        orch, server_task = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        argvs = [
            ["-m", "edge_sdk", "--server", url, "--id", "sdk-0", "--budget", "1GiB", "--client", "0",
             "--num-clients", "2", "--json-events", "--once"],
            ["-m", "edgetrain", "device", "--server", url, "--id", "cli-1", "--device-class", "pi-4-2gb",
             "--client", "1", "--num-clients", "2", "--json-events", "--once"],
        ]
        procs = [await asyncio.create_subprocess_exec(sys.executable, *argv, cwd=REPO, env=device_env(),
                                                      stdout=asyncio.subprocess.PIPE,
                                                      stderr=asyncio.subprocess.PIPE) for argv in argvs]
        history = await asyncio.wait_for(server_task, timeout=120)
        outputs = [await asyncio.wait_for(proc.communicate(), timeout=60) for proc in procs]
        held.extend(payload_folder("auto", url, device) for device in ("sdk-0", "cli-1"))
        return history, [proc.returncode for proc in procs], [out.decode() + err.decode() for out, err in outputs]

    held: list[Path | None] = []
    history, returncodes, outputs = asyncio.run(run())
    assert returncodes == [0, 0], outputs
    assert history[0]["reported"] == 2
    for out in outputs:
        events = [json.loads(line)["event"] for line in out.splitlines() if line.startswith("{")]
        assert "welcome" in events and "round_done" in events, out
    with Store(tmp_path / "store") as store:
        profiles = {d["device_id"]: d["profile"] for d in store.devices.all()}
    assert profiles["sdk-0"]["budget_bytes"] == 1 << 30 and profiles["sdk-0"]["device_class"] == ""
    assert profiles["cli-1"]["budget_bytes"] == load_device_class("pi-4-2gb").budget_bytes
    assert profiles["cli-1"]["device_class"] == "pi-4-2gb"
    # By default each device keeps what it downloaded (the tail, as a 4-bit delta download: the server's
    # default) in a folder of its own, with the slot a next round's delta is based on.
    for folder in held:
        assert folder is not None and (folder / "slots.json").is_file(), folder
        assert any(len(f.name) == 64 for f in folder.iterdir()), sorted(folder.iterdir())
