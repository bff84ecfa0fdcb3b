"""The device page's address for the person starting the server: a URL, and a QR code a phone's camera
opens (drawn with ``segno`` when it is installed, as it is with the ``server`` extra)."""

from __future__ import annotations

import socket
from typing import TextIO
from urllib.parse import quote

__all__ = ["announce", "page_url"]


def page_url(host: str, port: int, *, tls: bool, token: str = "") -> str:
    """The device page's URL. A wildcard host is shown as this machine's address on its network; the
    token, when devices need one, rides in the fragment (the browser keeps it: it is never sent in a request)."""
    fragment = f"#token={quote(token, safe='')}" if token else ""
    return f"{'https' if tls else 'http'}://{url_host(host)}:{port}/{fragment}"


def url_host(host: str) -> str:
    """``host`` as a URL names it: a wildcard as this machine's address on its network, IPv6 bracketed."""
    if host in ("", "0.0.0.0", "::"):
        host = lan_address()
    return f"[{host}]" if ":" in host else host


def lan_address() -> str:
    """This machine's address on the network its default route leaves by (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: routing only, nothing goes out
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def announce(url: str, stream: TextIO, *, install_url: str | None = None, fingerprint: str | None = None) -> None:
    """Print the device page's and the status page's URLs, and a QR code: of the device page, or with a
    local certificate authority (``install_url``) of the plain-http page that installs it and then
    opens the device page (docs/web.md, "A phone on the LAN")."""
    status = url.split("#", 1)[0] + "status"
    stream.write(f"device page: {url}\nstatus page: {status}\n")
    if install_url is not None:
        stream.write(f"a phone trusts this server once it installs its local certificate authority: {install_url}\n"
                     f"authority's SHA-256 fingerprint: {fingerprint}\n")
        url = install_url + (f"#{url.split('#', 1)[1]}" if "#" in url else "")
    if "//127." in url or "//[::1]" in url or "//localhost" in url:
        stream.write("(this machine only: --host 0.0.0.0 lets a phone on the same network open the page)\n")
    try:
        import segno
    except ImportError:
        stream.write("(pip install segno to show a QR code of the device page here)\n")
        return
    segno.make(url, error="m").terminal(out=stream, compact=True)
    stream.flush()
