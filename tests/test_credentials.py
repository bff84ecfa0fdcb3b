"""Per-device credentials: a device proves its enrolled secret without sending it; nobody else can take
its id, and unknown, revoked, stale, forged or replayed proofs are refused before any model data."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from edge_sdk import protocol as p
from edge_sdk.credentials import CredentialError, ReplayWindow, derive_key, make_proof, verify_proof
from edge_sdk.transport import recv_msg, send_msg, ws_options
from emulator.localfleet import start_orchestrator
from orchestrator.store import Store
from tests.factories import server_config


def test_a_proof_holds_only_for_its_device_key_door_time_and_once():
    key = derive_key("s3cret")
    replay = ReplayWindow()
    token = make_proof("dev", "s3cret", purpose="hello", now=1000.0, nonce="ab" * 8)
    assert "s3cret" not in token and token.startswith("hmac2:hello:1000:")
    assert verify_proof("dev", token, key, replay, purpose="hello", now=1010.0).nonce == "ab" * 8
    with pytest.raises(CredentialError, match="replayed"):
        verify_proof("dev", token, key, replay, purpose="hello", now=1011.0)
    with pytest.raises(CredentialError, match="does not match"):
        verify_proof("other", make_proof("dev", "s3cret", now=1000.0), key, replay, purpose="hello", now=1000.0)
    with pytest.raises(CredentialError, match="does not match"):
        verify_proof("dev", make_proof("dev", "wrong", now=1000.0), key, replay, purpose="hello", now=1000.0)
    with pytest.raises(CredentialError, match="server's clock"):
        verify_proof("dev", make_proof("dev", "s3cret", now=1000.0), key, replay, purpose="hello", now=2000.0)
    with pytest.raises(CredentialError, match="form"):
        verify_proof("dev", "s3cret", key, replay, purpose="hello", now=1000.0)
    with pytest.raises(CredentialError, match="made for 'status' is no good for 'hello'"):
        verify_proof("dev", make_proof("dev", "s3cret", purpose="status", now=1000.0), key, replay, purpose="hello",
                     now=1000.0)
    # the purpose is signed: relabelling a status proof as a hello's breaks its MAC
    relabelled = make_proof("dev", "s3cret", purpose="status", now=1000.0).replace(":status:", ":hello:")
    with pytest.raises(CredentialError, match="does not match"):
        verify_proof("dev", relabelled, key, replay, purpose="hello", now=1000.0)
    with pytest.raises(ValueError, match="purpose"):
        make_proof("dev", "s3cret", purpose="enrol-anything")


def test_a_format_1_proof_is_refused_naming_both_formats():
    nonce = "00112233445566778899aabbccddeeff"
    mac = hmac.new(derive_key("s3cret"), f"dev|1000|{nonce}".encode(), hashlib.sha256).hexdigest()
    with pytest.raises(CredentialError, match="format hmac1 is no longer accepted.*hmac2"):
        verify_proof("dev", f"hmac1:1000:{nonce}:{mac}", derive_key("s3cret"), ReplayWindow(), purpose="hello",
                     now=1000.0)


def _hello(device_id: str, token: str) -> p.Hello:
    return p.Hello(device_id=device_id, token=token, budget_bytes=2 << 30, cores=1, runtimes=["torch"], num_samples=10)


def test_the_server_binds_each_device_id_to_its_credential(tmp_path: Path) -> None:
    store_dir = tmp_path / "s"
    with Store(store_dir) as store:
        secret_a = store.credentials.enroll("dev-a", samples=30)
        secret_b = store.credentials.enroll("dev-b")
        assert store.credentials.get("dev-a")["key"] == derive_key(secret_a)  # the secret itself is never stored
        assert [c["device_id"] for c in store.credentials.all()] == ["dev-a", "dev-b"]

    async def answer(url: str, hello: p.Hello):
        async with connect(url, **ws_options()) as ws:
            await send_msg(ws, hello)
            return await recv_msg(ws)

    async def main():
        config = server_config(store_dir, min_devices=5, require_credentials=True, wait_devices_s=30)
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"
        out = {}
        token_a = make_proof("dev-a", secret_a)
        async with connect(url, **ws_options()) as ws_a:
            await send_msg(ws_a, _hello("dev-a", token_a))
            out["a"] = await recv_msg(ws_a)
            first = orch.sessions["dev-a"]
            out["impostor"] = await answer(url, _hello("dev-a", make_proof("dev-a", secret_b)))
            out["replay"] = await answer(url, _hello("dev-a", token_a))
            out["stale"] = await answer(url, _hello("dev-a", make_proof("dev-a", secret_a, now=time.time() - 3600)))
            out["unknown"] = await answer(url, _hello("dev-z", make_proof("dev-z", secret_a)))
            out["a_kept"] = orch.sessions["dev-a"] is first and ws_a.close_code is None
            with Store(store_dir) as store:
                assert store.credentials.revoke("dev-b") and not store.credentials.revoke("dev-b")
            out["revoked"] = await answer(url, _hello("dev-b", make_proof("dev-b", secret_b)))
            out["again"] = await answer(url, _hello("dev-a", make_proof("dev-a", secret_a)))  # replaces, by proof
            out["a_replaced"] = orch.sessions.get("dev-a") is not first
        server.cancel()
        return out

    out = asyncio.run(main())
    assert isinstance(out["a"], p.Welcome) and isinstance(out["again"], p.Welcome)
    for case in ("impostor", "replay", "stale", "unknown", "revoked"):
        assert isinstance(out[case], p.Error) and out[case].code == "unauthorized", case
    assert "replayed" in out["replay"].message and "does not match" in out["impostor"].message
    assert out["a_kept"] and out["a_replaced"]


@pytest.mark.slow
def test_enrolled_device_processes_train_and_others_are_refused(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    store_dir = tmp_path / "s"
    cli = [sys.executable, "-m", "edgetrain", "device"]
    for d in ("dev-0", "dev-1"):
        subprocess.run([*cli, "enroll", "--store", str(store_dir), "--id", d, "--out", str(tmp_path / f"{d}.secret")],
                       check=True, cwd=root, capture_output=True)
    listed = subprocess.run([*cli, "list", "--store", str(store_dir)], check=True, cwd=root, capture_output=True,
                            text=True).stdout
    assert "dev-0\tactive" in listed and "dev-1\tactive" in listed
    (tmp_path / "forged.secret").write_text("not-the-secret\n")

    async def main():
        config = server_config(store_dir, min_devices=2, require_credentials=True, local_steps=2)
        orch, server = await start_orchestrator(config, lambda kind, data: None)
        url = f"ws://127.0.0.1:{orch.port}"

        async def device(device_id: str, secret: str, client: int):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "edge_sdk", "--server", url, "--id", device_id, "--budget", "2GiB",
                "--data", "synthetic", "--client", str(client), "--num-clients", "2", "--secret-file",
                str(tmp_path / secret), "--reconnect-retries", "0", "--once", cwd=root,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out, err = await proc.communicate()
            return proc.returncode, err.decode()

        forged = await device("dev-1", "forged.secret", 1)  # before the real ones: refused, nothing learned
        results = await asyncio.gather(device("dev-0", "dev-0.secret", 0), device("dev-1", "dev-1.secret", 1), server)
        return forged, results

    forged, (dev0, dev1, history) = asyncio.run(main())
    assert forged[0] != 0 and "unauthorized" in forged[1]
    assert dev0[0] == 0 and dev1[0] == 0, (dev0[1][-1000:], dev1[1][-1000:])
    assert history[0]["reported"] == 2
