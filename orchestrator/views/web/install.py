"""How a phone comes to trust the local certificate authority (:mod:`~orchestrator.views.web.certs`): a small
plain-http site beside the server's https port, which a phone opens before it trusts anything.

- ``/`` (and ``/install``): the install page: the authority's SHA-256 fingerprint, its certificate to
  download, the steps on Android, iOS and desktops, and a check (``/trust.json`` on the https port) that
  says when this phone trusts the server and links to the device page;
- ``/ca.crt`` (DER, ``application/x-x509-ca-cert``: what Android's and iOS's installers take) and
  ``/ca.pem``;
- anything else: a redirect to the same path on the https port.

Only public things are served here: the authority's certificate, never its key, and no page of the run.
"""

from __future__ import annotations

import contextlib
import html
import json
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Request, Response

from orchestrator.views.web.certs import PRIVATE_RANGES, LocalAuthority
from orchestrator.views.web.files import STATIC, respond

__all__ = ["InstallSite", "ca_response", "coverage", "install_page", "trust_response"]

HTML = "text/html; charset=utf-8"


def ca_response(authority: LocalAuthority, *, pem: bool = False) -> Response:
    """The authority's certificate, as a download a phone's installer opens."""
    body, kind = (authority.ca_pem, "application/x-pem-file") if pem else (authority.ca_der, "application/x-x509-ca-cert")
    name = "edgetrain-ca.pem" if pem else "edgetrain-ca.crt"
    return respond(200, body, kind, extra={"Content-Disposition": f'attachment; filename="{name}"'}, isolated=False)


def coverage(authority: LocalAuthority) -> str:
    """What the authority may vouch for, in words: its name constraints, which are the private ranges and
    names (:data:`~orchestrator.views.web.certs.PRIVATE_RANGES`) and the public addresses this machine had when
    the authority was made."""
    from cryptography import x509

    permitted = x509.load_der_x509_certificate(authority.ca_der).extensions.get_extension_for_class(
        x509.NameConstraints).value.permitted_subtrees or []
    public = [str(g.value.network_address) for g in permitted
              if isinstance(g, x509.IPAddress) and g.value not in PRIVATE_RANGES]
    where = "" if not public else f", and this machine's public address{'es' * (len(public) > 1)} {', '.join(public)}"
    return f"private network addresses, localhost and .local names{where}"


def install_page(authority: LocalAuthority, device_url: str) -> Response:
    """The install page (``static/install.html``) for this authority and the device page at ``device_url``."""
    text = (STATIC / "install.html").read_text()
    for key, value in {"FINGERPRINT": authority.fingerprint, "DEVICE_URL": device_url,
                       "NAMES": ", ".join(authority.names), "COVERS": coverage(authority)}.items():
        text = text.replace(f"{{{{{key}}}}}", html.escape(value))
    return respond(200, text.encode(), HTML, isolated=False)


def trust_response() -> Response:
    """``/trust.json`` on the https port: readable from the install page's origin, so that page learns
    whether this phone trusts the server (the request fails before any answer when it does not)."""
    return respond(200, json.dumps({"trusted": True}).encode(), "application/json",
                   extra={"Access-Control-Allow-Origin": "*", "Cross-Origin-Resource-Policy": "cross-origin"})


class InstallSite:
    """The plain-http listener: the install page, the certificate, and redirects to the https port
    (``https_port()``: known once the server listens)."""

    def __init__(self, authority: LocalAuthority, https_port: Callable[[], int | None]) -> None:
        self.authority = authority
        self.https_port = https_port
        self.port: int | None = None

    def device_url(self, host_header: str) -> str:
        host = urlsplit(f"//{host_header}").hostname or "localhost"
        host = f"[{host}]" if ":" in host else host
        return f"https://{host}:{self.https_port()}/"

    def process_request(self, connection: ServerConnection, request: Request) -> Response:
        path = urlsplit(request.path).path
        device_url = self.device_url(request.headers.get("Host", ""))
        if path in ("/", "/install"):
            return install_page(self.authority, device_url)
        if path in ("/ca.crt", "/ca.pem"):
            return ca_response(self.authority, pem=path == "/ca.pem")
        return respond(302, b"", "text/plain", extra={"Location": device_url.rstrip("/") + request.path},
                       isolated=False)

    @contextlib.asynccontextmanager
    async def serving(self, host: str, port: int) -> AsyncIterator[InstallSite]:
        """Listen on ``host:port`` (0: any free port, then :attr:`port`) while the block runs."""
        async def never(ws: ServerConnection) -> None:  # every request is answered before an upgrade
            await ws.close()

        async with serve(never, host, port, process_request=self.process_request) as server:
            self.port = server.sockets[0].getsockname()[1]
            yield self
