"""``serve --web`` for a phone on a LAN (docs/web.md, "A phone on the LAN"), with real servers and clients:
the local certificate authority (kept, name-constrained, verified by ``cryptography``'s own path
validation), the port over TLS from it and the plain-http install page, the least budget the page is
offered (a hello at it is welcomed, one byte less is refused), the journal's rounds of a device, and the
files served gzip-compressed with ETags. The browser side is edge_sdk_js/test/phone-lan.test.mjs."""

from __future__ import annotations

import asyncio
import gzip
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("cryptography")

from cryptography import x509  # noqa: E402
from cryptography.x509.verification import PolicyBuilder, Store as TrustStore, VerificationError  # noqa: E402

from edge_sdk import protocol as p  # noqa: E402
from edge_sdk.transport import client_tls, recv_msg, send_msg, ws_options  # noqa: E402
from edgetrain.cli.serve import _web_authority, _with_tls  # noqa: E402
from emulator.localfleet import start_orchestrator  # noqa: E402
from orchestrator.config import ServerConfig  # noqa: E402
from orchestrator.views.web.certs import local_authority  # noqa: E402
from orchestrator.views.web.install import InstallSite  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402

WASM = bytes(range(256)) * 4096  # 1 MiB that compresses, as WebAssembly does


def _sdk(root: Path) -> Path:
    for name, data in {"dist/edgetrain.browser.mjs": b"export const sdk = 1;\n" * 200,
                       "node_modules/onnxruntime-web/dist/ort.wasm.min.mjs": b"export {};\n",
                       "node_modules/onnxruntime-web/dist/ort-wasm-simd-threaded.wasm": WASM}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def _get(url: str, headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None
         ) -> tuple[int, dict[str, str], bytes]:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kw: object) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect, urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=60) as res:
            return res.status, dict(res.headers), res.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()
    except urllib.error.URLError as exc:  # no connection: a TLS handshake refused
        return 0, {}, str(exc.reason).encode()


def _verify(authority_dir: Path, name: x509.GeneralName) -> None:
    """The server certificate's chain to the authority, as a client checks it (names, constraints, usage)."""
    ca = x509.load_pem_x509_certificate((authority_dir / "ca.pem").read_bytes())
    leaf, _ = x509.load_pem_x509_certificates((authority_dir / "server.pem").read_bytes())
    PolicyBuilder().store(TrustStore([ca])).build_server_verifier(name).verify(leaf, [])


def test_the_authority_is_kept_constrained_and_issues_for_new_addresses(tmp_path: Path) -> None:
    folder = tmp_path / "web-ca"
    first = local_authority(folder, ["10.1.2.3", "::1"])
    assert first.key_file.stat().st_mode & 0o077 == 0 and (folder / "ca-key.pem").stat().st_mode & 0o077 == 0
    _verify(folder, x509.IPAddress(__import__("ipaddress").ip_address("10.1.2.3")))
    _verify(folder, x509.DNSName("localhost"))
    ca = x509.load_der_x509_certificate(first.ca_der)
    constraints = ca.extensions.get_extension_for_class(x509.NameConstraints)
    assert constraints.critical and ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    leaf = x509.load_pem_x509_certificates(first.cert_file.read_bytes())[0]
    assert (leaf.not_valid_after_utc - leaf.not_valid_before_utc).days <= 825  # what iOS and Android take

    again = local_authority(folder, ["10.1.2.3"])  # a restart: the same authority and certificate
    assert again.ca_der == first.ca_der and again.cert_file.read_bytes() == first.cert_file.read_bytes()
    assert again.fingerprint == first.fingerprint and len(first.fingerprint.split(":")) == 32

    moved = local_authority(folder, ["192.168.7.9"])  # a new address: a new certificate, the same authority
    assert moved.ca_der == first.ca_der and "192.168.7.9" in moved.names
    _verify(folder, x509.IPAddress(__import__("ipaddress").ip_address("192.168.7.9")))

    # An internet address it was not made for: left out of the certificate, and no client takes it for it.
    public = local_authority(folder, ["192.168.7.9", "8.8.8.8"])
    assert "8.8.8.8" not in public.names
    with pytest.raises(VerificationError):
        _verify(folder, x509.IPAddress(__import__("ipaddress").ip_address("8.8.8.8")))


def test_serve_options_choose_the_authority(tmp_path: Path) -> None:
    import typer

    def config(**kw: object) -> ServerConfig:
        return ServerConfig(model="tiny", eval_data="synthetic", store_dir=tmp_path / "store", **kw)

    options = {"web_tls": "auto", "web_ca": None, "web_http_port": -1, "web_condition": []}
    assert _web_authority(config(web=True), **options) is None  # loopback: plain http is a secure context there
    assert _web_authority(config(host="0.0.0.0"), **options) is None  # no pages: nothing to make
    lan = config(web=True, host="0.0.0.0")
    authority = _web_authority(lan, **options)
    assert authority is not None and _with_tls(lan, authority).tls_cert == str(authority.cert_file)
    assert authority.folder == tmp_path / "store" / "web-ca"
    assert _web_authority(config(web=True, host="0.0.0.0"), **{**options, "web_tls": "off"}) is None
    for bad in ({"web_tls": "local-ca"}, {"web_tls": "maybe"}, {"web_condition": ["sunny"]}):
        with pytest.raises(typer.Exit):
            _web_authority(config(), **{**options, **bad})


def test_tls_from_the_authority_install_page_budget_and_rounds(tmp_path: Path) -> None:
    authority = local_authority(tmp_path / "ca", ["127.0.0.1"])
    trusted = client_tls(authority.folder / "ca.pem")

    async def main() -> dict:
        cfg = ServerConfig(model="digits_mlp", rounds=1, min_devices=5, eval_data="digits", wait_devices_s=60,
                           store_dir=tmp_path / "store", web=True, web_sdk=str(_sdk(tmp_path / "sdk")),
                           tls_cert=str(authority.cert_file), tls_key=str(authority.key_file))
        orch, server = await start_orchestrator(cfg, lambda k, d: None)
        orch.web.authority = authority
        site = f"https://127.0.0.1:{orch.port}"
        get = lambda path, **h: asyncio.to_thread(_get, site + path, h, trusted)  # noqa: E731
        out: dict = {k: await get(k) for k in ("/web.json", "/trust.json", "/ca.crt", "/sw.js", "/budget.json?samples=180",
                                               "/budget.json?samples=x", "/device.json?id=phone-1",
                                               "/budget.json?samples=180&runtime=onnxruntime-webgpu",
                                               "/budget.json?samples=180&runtime=torch")}
        least = json.loads(out["/budget.json?samples=180"][2])["budget_bytes"]
        for budget in (least - 1, least):
            async with connect(f"wss://127.0.0.1:{orch.port}", ssl=trusted, **ws_options()) as ws:
                await send_msg(ws, p.Hello(device_id=f"phone-{budget}", token="", budget_bytes=budget, cores=1,
                                           runtimes=["onnxruntime-web"], num_samples=180))
                out[budget] = await recv_msg(ws)
        orch.store.rounds.begin(1, ["phone-1"])
        orch.store.reports.record(1, "phone-1", {"accepted": True, "num_samples": 180}, phase="train")
        out["rounds"] = await get("/device.json?id=phone-1")
        out["untrusted"] = await asyncio.to_thread(_get, site + "/web.json", None, ssl.create_default_context())
        install = InstallSite(authority, lambda: orch.port)
        async with install.serving("127.0.0.1", 0):
            plain = f"http://127.0.0.1:{install.port}"
            out["install"] = await asyncio.to_thread(_get, plain + "/")
            out["plain ca"] = await asyncio.to_thread(_get, plain + "/ca.crt")
            out["redirect"] = await asyncio.to_thread(_get, plain + "/status?x=1")
        server.cancel()
        return out | {"least": least}

    out = asyncio.run(main())
    assert json.loads(out["/web.json"][2])["tls"] is True
    assert out["untrusted"][0] == 0 and b"CERTIFICATE_VERIFY_FAILED" in out["untrusted"][2]  # not without the authority
    assert out["/trust.json"][1]["Access-Control-Allow-Origin"] == "*"
    assert out["/ca.crt"][2] == authority.ca_der == out["plain ca"][2]
    assert out["/ca.crt"][1]["Content-Type"] == "application/x-x509-ca-cert"
    status, _, page = out["install"]
    assert status == 200 and authority.fingerprint.encode() in page and b"Certificate Trust Settings" in page
    # What the authority covers, as its name constraints say: private ranges and names (no public address here).
    assert b"It may vouch only for private network addresses, localhost and .local names, never" in page
    assert b"[hidden] { display: none !important; }" in page  # the button's own display would show it hidden
    assert "Cross-Origin-Embedder-Policy" not in out["install"][1]  # it checks the https port from its own origin
    assert out["redirect"][0] == 302 and out["redirect"][1]["Location"].endswith("/status?x=1")
    assert out["redirect"][1]["Location"].startswith("https://127.0.0.1:")
    sw = out["/sw.js"][2].decode()
    assert sw.startswith("const VERSION = ") and "/sdk/dist/edgetrain.browser.mjs" in sw
    assert out["/budget.json?samples=x"][0] == 400
    # A page training on its GPU is offered the least budget of the WebGPU build, which holds more.
    gpu = json.loads(out["/budget.json?samples=180&runtime=onnxruntime-webgpu"][2])
    assert gpu["runtime"] == "onnxruntime-webgpu" and gpu["budget_bytes"] > out["least"]
    assert out["/budget.json?samples=180&runtime=torch"][0] == 400
    # The least budget the page is offered is the server's own: at it the device is welcomed, below refused.
    assert isinstance(out[out["least"]], p.Welcome)
    assert isinstance(out[out["least"] - 1], p.Error) and out[out["least"] - 1].code == "refused"
    assert json.loads(out["/device.json?id=phone-1"][2])["rounds"] == 0
    assert json.loads(out["rounds"][2]) == {"device": "phone-1", "rounds": 1, "last_round": 1}


def test_files_are_gzipped_once_and_revalidated_by_etag(tmp_path: Path) -> None:
    async def main() -> dict:
        cfg = ServerConfig(model="tiny", rounds=1, min_devices=5, eval_data="synthetic", wait_devices_s=60,
                           store_dir=tmp_path / "store", web=True, web_sdk=str(_sdk(tmp_path / "sdk")))
        orch, server = await start_orchestrator(cfg, lambda k, d: None)
        site = f"http://127.0.0.1:{orch.port}"
        wasm = site + "/sdk/ort/ort-wasm-simd-threaded.wasm"
        out = {"gz": await asyncio.to_thread(_get, wasm, {"Accept-Encoding": "gzip, deflate, br"}),
               "plain": await asyncio.to_thread(_get, wasm, {"Accept-Encoding": "identity"}),
               "refused gz": await asyncio.to_thread(_get, wasm, {"Accept-Encoding": "gzip;q=0"}),
               "bundle": await asyncio.to_thread(_get, site + "/sdk/dist/edgetrain.browser.mjs", {"Accept-Encoding": "gzip"})}
        etag = out["gz"][1]["ETag"]
        out["again"] = await asyncio.to_thread(_get, wasm, {"Accept-Encoding": "gzip", "If-None-Match": etag})
        out["other"] = await asyncio.to_thread(_get, wasm, {"If-None-Match": etag})
        server.cancel()
        return out

    out = asyncio.run(main())
    status, headers, body = out["gz"]
    assert status == 200 and headers["Content-Encoding"] == "gzip" and headers["Vary"] == "Accept-Encoding"
    assert gzip.decompress(body) == WASM and len(body) < len(WASM) // 20
    assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"
    assert headers["Cache-Control"] == "public, max-age=86400"
    assert "Content-Encoding" not in out["plain"][1] and out["plain"][2] == WASM
    assert "Content-Encoding" not in out["refused gz"][1]
    assert out["bundle"][1]["Cache-Control"] == "no-cache" and out["bundle"][1]["Content-Encoding"] == "gzip"
    assert out["again"][0] == 304 and out["again"][2] == b""
    assert out["other"][0] == 200  # the identity copy has its own tag: not the gzipped one's


def test_a_large_file_is_served_at_once_and_compressed_in_the_background(tmp_path: Path) -> None:
    """A file over COMPRESS_NOW (the WebGPU build's WebAssembly is 27 MB) is not compressed inside a
    request: its plain bytes serve until the background thread's gzip form is ready, then that."""
    import time

    from orchestrator.views.web.files import COMPRESS_NOW, Asset

    path = tmp_path / "big.wasm"
    path.write_bytes(WASM * (COMPRESS_NOW // len(WASM) + 3))
    asset = Asset.of(path)
    first = asset.response("gzip", "", "no-cache")
    body = gzip.decompress(first.body) if first.headers.get("Content-Encoding") == "gzip" else first.body
    assert first.status_code == 200 and body == path.read_bytes()
    deadline = time.monotonic() + 60
    while asset.gzipped is None and time.monotonic() < deadline:
        time.sleep(0.05)
    later = asset.response("gzip", "", "no-cache")
    assert later.headers["Content-Encoding"] == "gzip" and gzip.decompress(later.body) == path.read_bytes()
    assert later.headers["ETag"] != asset.response("identity", "", "no-cache").headers["ETag"]


def test_the_install_page_names_the_public_addresses_the_authority_covers(tmp_path: Path) -> None:
    # An authority made on a machine with a public address also vouches for that address (its name
    # constraints): the install page says so rather than "private network addresses" alone.
    from orchestrator.views.web.install import coverage, install_page

    authority = local_authority(tmp_path / "ca", ["127.0.0.1", "203.0.113.7"])
    assert coverage(authority) == ("private network addresses, localhost and .local names, "
                                   "and this machine's public address 203.0.113.7")
    page = install_page(authority, "https://203.0.113.7:8765/").body.decode()
    assert "public address 203.0.113.7, never for another site on the internet" in page
    assert "This server's certificate names 127.0.0.1, 203.0.113.7, localhost" in page
