"""``edgetrain serve --web``: the websocket port also answers plain HTTP requests with the device page,
the JavaScript SDK's files (with the cross-origin isolation headers) and demo shards, and a read-only
status that needs the devices' token or an enrolled credential; devices still connect on that port.
Without --web the port serves no page. (A browser opening the pages: edge_sdk_js/test/web.test.mjs.)"""

from __future__ import annotations

import asyncio
import io
import json
import urllib.error
import urllib.request
from pathlib import Path

from websockets.asyncio.client import connect

from edge_sdk import protocol as p
from edge_sdk.credentials import make_proof
from edge_sdk.transport import recv_msg, send_msg, ws_options
from emulator.localfleet import start_orchestrator
from orchestrator.config import ServerConfig
from orchestrator.store import Store
from orchestrator.views.terminal import announce, page_url
from tests.factories import server_config


def _sdk(root: Path) -> Path:
    """A JavaScript SDK folder as the site reads it: a build (its browser bundle) and onnxruntime-web."""
    for name, text in {"dist/index.js": "export const sdk = 1;\n", "package.json": "{}",
                       "dist/edgetrain.browser.mjs": "export const sdk = 1;\n",
                       "node_modules/@msgpack/msgpack/dist.esm/index.mjs": "export {};\n",
                       "node_modules/onnxruntime-web/dist/ort.wasm.min.mjs": "export {};\n",
                       "node_modules/onnxruntime-web/dist/ort-wasm-simd-threaded.wasm": "\0asm"}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as res:
            return res.status, dict(res.headers), res.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _config(tmp_path: Path, **kw: object) -> ServerConfig:
    return server_config(tmp_path / "store", min_devices=5, wait_devices_s=60,
                         web_sdk=str(_sdk(tmp_path / "sdk")), **kw)


async def _hello(url: str, device_id: str, token: str) -> p.Message:
    async with connect(url, **ws_options()) as ws:
        await send_msg(ws, p.Hello(device_id=device_id, token=token, budget_bytes=2 << 30, cores=1,
                                   runtimes=["onnxruntime-web"], num_samples=10))
        return await recv_msg(ws)


def test_pages_status_and_devices_share_the_port(tmp_path: Path) -> None:
    async def main() -> dict:
        orch, server = await start_orchestrator(_config(tmp_path, web=True, token="s3cret"), lambda k, d: None)
        site, url = f"http://127.0.0.1:{orch.port}", f"ws://127.0.0.1:{orch.port}"
        get = lambda path, **h: asyncio.to_thread(_get, site + path, h)  # noqa: E731
        out = {path: await get(path) for path in ("/", "/status", "/static/device.js", "/sdk/dist/index.js",
                                                   "/sdk/ort/ort-wasm-simd-threaded.wasm", "/sdk/dist/../package.json",
                                                   "/sdk/dist/%2e%2e/package.json", "/sdk/node_modules/x", "/web.json",
                                                   "/shard/1.bin", "/shard/99.bin", "/status.json")}
        out["wrong token"] = await get("/status.json", Authorization="Bearer nope")
        async with connect(url, **ws_options()) as ws:  # a device on the same port, kept connected
            await send_msg(ws, p.Hello(device_id="phone-1", token="s3cret", budget_bytes=320 << 20, cores=2,
                                       runtimes=["onnxruntime-web"], num_samples=10))
            out["welcome"] = await recv_msg(ws)
            out["refused"] = await _hello(url, "intruder", "guess")
            out["status"] = await get("/status.json", Authorization="Bearer s3cret")
        server.cancel()
        return out

    out = asyncio.run(main())
    for path in ("/", "/status", "/static/device.js", "/sdk/dist/index.js", "/sdk/ort/ort-wasm-simd-threaded.wasm"):
        status, headers, _ = out[path]
        assert status == 200, path
        assert headers["Cross-Origin-Opener-Policy"] == "same-origin", path
        assert headers["Cross-Origin-Embedder-Policy"] == "require-corp", path
    assert out["/sdk/ort/ort-wasm-simd-threaded.wasm"][1]["Content-Type"] == "application/wasm"
    assert out["/sdk/dist/index.js"][2] == b"export const sdk = 1;\n"
    assert b"/sdk/dist/edgetrain.browser.mjs" in out["/static/device.js"][2]  # one bundle: no import map
    for path in ("/sdk/dist/../package.json", "/sdk/dist/%2e%2e/package.json", "/sdk/node_modules/x", "/shard/99.bin"):
        assert out[path][0] == 404, path
    info = json.loads(out["/web.json"][2])
    assert info["auth"] == "token" and info["rounds"] == 1 and info["sdk_missing"] is None
    shard = p.decode_tensors(out["/shard/1.bin"][2])
    assert shard["x"].shape[0] == shard["y"].shape[0] > 0
    assert out["/status.json"][0] == 401 and out["wrong token"][0] == 401
    assert isinstance(out["welcome"], p.Welcome)
    assert isinstance(out["refused"], p.Error) and out["refused"].code == "unauthorized"
    status, _, body = out["status"]
    assert status == 200
    snap = json.loads(body)
    (phone,) = snap["devices"]
    assert phone["id"] == "phone-1" and phone["connected"] and phone["runtimes"] == ["onnxruntime-web"]
    assert phone["budget_bytes"] == 320 << 20 and phone["role"] == out["welcome"].role
    assert phone["split"] == out["welcome"].split
    assert snap["rounds_total"] == 1 and snap["rounds_done"] == 0
    assert any(n["kind"] == "closed" and n["device"] == "intruder" and n["message"] == "bad credentials"
               for n in snap["notices"]), snap["notices"]


def test_status_behind_credentials(tmp_path: Path) -> None:
    with Store(tmp_path / "store") as store:
        secret = store.credentials.enroll("viewer-1")

    async def main() -> list[int]:
        orch, server = await start_orchestrator(_config(tmp_path, web=True, require_credentials=True), lambda k, d: None)
        site = f"http://127.0.0.1:{orch.port}/status.json"
        proof = make_proof("viewer-1", secret, purpose="status")
        codes = [(await asyncio.to_thread(_get, site, h))[0] for h in (
            {"Authorization": f"Edgetrain viewer-1 {proof}"},
            {"Authorization": f"Edgetrain viewer-1 {proof}"},  # the same proof again: a replay
            {"Authorization": f"Edgetrain viewer-1 {make_proof('viewer-1', 'not-the-secret', purpose='status')}"},
            {"Authorization": f"Edgetrain nobody {make_proof('nobody', secret, purpose='status')}"},
            {"Authorization": f"Edgetrain viewer-1 {make_proof('viewer-1', secret)}"},  # a hello's proof
            {"Authorization": "Bearer anything"},
            {})]
        server.cancel()
        return codes

    assert asyncio.run(main()) == [200, 401, 401, 401, 401, 401, 401]


def test_without_web_the_port_serves_no_page(tmp_path: Path) -> None:
    async def main() -> list[int]:
        orch, server = await start_orchestrator(_config(tmp_path), lambda k, d: None)
        site = f"http://127.0.0.1:{orch.port}"
        codes = [(await asyncio.to_thread(_get, site + path))[0] for path in ("/", "/status.json", "/sdk/dist/index.js")]
        server.cancel()
        return codes

    assert all(code != 200 for code in asyncio.run(main()))


def test_the_terminal_shows_the_page_url_and_its_qr_code() -> None:
    url = page_url("0.0.0.0", 8765, tls=True, token="a b#c")
    assert url.startswith("https://") and "0.0.0.0" not in url and url.endswith(":8765/#token=a%20b%23c")
    assert page_url("::1", 9, tls=False) == "http://[::1]:9/"
    out = io.StringIO()
    announce("http://127.0.0.1:8765/#token=t", out)
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["device page: http://127.0.0.1:8765/#token=t", "status page: http://127.0.0.1:8765/status"]
    assert "--host 0.0.0.0" in lines[2]
    assert sum("\u2588" in line for line in lines) > 10  # the QR code's rows (segno, the server extra)
