"""A local certificate authority for ``edgetrain serve --web`` on a LAN: a phone opens the device page over
``https://`` once it trusts this authority, which makes the page a secure context (docs/web.md, "A phone
on the LAN"): cross-origin isolation (WebAssembly threads), ``navigator.deviceMemory``, WebCrypto, a
service worker. Plain ``http://`` on a LAN address gives none of them.

The authority is made once and kept in its folder (``<store>/web-ca`` by default), so a phone installs it
once per folder; the server's certificate is issued from it for this machine's addresses and issued again
when they change or it nears its end. Keys and certificates come from ``cryptography``.

The authority is name-constrained (RFC 5280, 4.2.1.10) to private, link-local and loopback addresses and
to ``localhost`` and ``.local`` names, plus the public addresses this machine had when it was made: a
phone that trusts it trusts it for nothing on the internet, even if its key leaked. iOS and Android take a
server certificate of at most 825 days, with the server-auth usage and the names in its subject
alternative names: this one lasts 397 days.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import logging
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from edge_sdk.fileio import atomic_write

__all__ = ["LocalAuthority", "local_authority", "machine_addresses"]

log = logging.getLogger("edgetrain.web")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Address ranges the authority may vouch for: private (RFC 1918, RFC 4193), shared (RFC 6598, e.g.
#: a mesh VPN), link-local and loopback.
PRIVATE_RANGES = tuple(ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8",
    "fc00::/7", "fe80::/10", "::1/128"))
#: DNS names it may vouch for: this machine (localhost) and multicast-DNS names (``host.local``).
PRIVATE_NAMES = ("localhost", "local")
CA_DAYS = 3650
SERVER_DAYS = 397
RENEW_DAYS = 30


@dataclass(frozen=True)
class LocalAuthority:
    """The authority and the server certificate it issued: what ``serve`` listens with and what the
    install page offers."""

    folder: Path
    ca_pem: bytes
    ca_der: bytes
    cert_file: Path
    key_file: Path
    names: tuple[str, ...]  # what the server certificate names (addresses and DNS names)

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the authority's certificate, as phones show it (colon-separated hex)."""
        digest = hashlib.sha256(self.ca_der).hexdigest().upper()
        return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))

    @property
    def spki_sha256(self) -> str:
        """Base64 SHA-256 of the authority's public key (SubjectPublicKeyInfo), as Chromium's
        ``--ignore-certificate-errors-spki-list`` and HTTP public-key pins name a key."""
        from cryptography import x509
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        spki = x509.load_der_x509_certificate(self.ca_der).public_key().public_bytes(
            Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
        return base64.b64encode(hashlib.sha256(spki).digest()).decode()


def machine_addresses(host: str) -> list[str]:
    """The addresses a device may reach the server at: ``host`` itself, or for a wildcard host every
    interface's address (IPv6 link-local ones left out: a URL needs their zone), loopback included."""
    if host not in ("", "0.0.0.0", "::"):
        return [host]
    import psutil

    found: list[str] = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family not in (socket.AF_INET, socket.AF_INET6) or "%" in a.address:
                continue
            ip = ipaddress.ip_address(a.address)
            if not ip.is_link_local and str(ip) not in found:
                found.append(str(ip))
    return found or ["127.0.0.1"]


def local_authority(folder: Path, addresses: Iterable[str]) -> LocalAuthority:
    """The authority kept in ``folder`` (made on first use) and a server certificate for ``addresses``,
    ``localhost`` and this machine's ``.local`` name, issued again when it lacks one of them or nears
    its end. Addresses outside the authority's constraints are left out, with a warning."""
    folder.mkdir(parents=True, exist_ok=True)
    wanted = [a for a in dict.fromkeys(addresses)]
    ca_key, ca_cert = _authority(folder, wanted)
    ips, dns = _names(ca_cert, wanted)
    cert_file, key_file = folder / "server.pem", folder / "server-key.pem"
    if not _current(cert_file, key_file, ips, dns):
        _issue(ca_key, ca_cert, ips, dns, cert_file, key_file)
    from cryptography.hazmat.primitives.serialization import Encoding

    return LocalAuthority(folder, ca_cert.public_bytes(Encoding.PEM), ca_cert.public_bytes(Encoding.DER), cert_file,
                          key_file, tuple([*map(str, ips), *dns]))


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _write_key(path: Path, key: object) -> None:
    from cryptography.hazmat.primitives import serialization

    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,  # type: ignore[attr-defined]
                            serialization.NoEncryption())
    atomic_write(path, pem)
    os.chmod(path, 0o600)


def _authority(folder: Path, addresses: list[str]):  # -> (key, certificate)
    """The kept authority, or a new one (ECDSA P-256) whose name constraints also take this machine's
    public addresses of now."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key_file, cert_file = folder / "ca-key.pem", folder / "ca.pem"
    if key_file.exists() and cert_file.exists():
        return (serialization.load_pem_private_key(key_file.read_bytes(), None),
                x509.load_pem_x509_certificate(cert_file.read_bytes()))
    key = ec.generate_private_key(ec.SECP256R1())
    public = [ipaddress.ip_network(a) for a in addresses if not _private(ipaddress.ip_address(a))]
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "edgetrain"),
                      x509.NameAttribute(NameOID.COMMON_NAME, f"edgetrain local CA ({socket.gethostname()[:32]})")])
    constraints = x509.NameConstraints(
        permitted_subtrees=[*(x509.IPAddress(n) for n in (*PRIVATE_RANGES, *public)),
                            *(x509.DNSName(d) for d in PRIVATE_NAMES)], excluded_subtrees=None)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(hours=1))
            .not_valid_after(_now() + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(constraints, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    _write_key(key_file, key)
    atomic_write(cert_file, cert.public_bytes(serialization.Encoding.PEM))
    log.info("made a local certificate authority in %s", folder)
    return key, cert


def _private(ip: Address) -> bool:
    return any(ip.version == n.version and ip in n for n in PRIVATE_RANGES)


def _names(ca_cert, addresses: list[str]) -> tuple[list[Address], list[str]]:
    """The addresses and DNS names the server certificate names: those the authority may vouch for."""
    from cryptography import x509

    permitted = ca_cert.extensions.get_extension_for_class(x509.NameConstraints).value.permitted_subtrees
    networks = [g.value for g in permitted if isinstance(g, x509.IPAddress)]
    ips: list[Address] = []
    for a in ["127.0.0.1", *addresses]:
        ip = ipaddress.ip_address(a)
        if not any(ip.version == n.version and ip in n for n in networks):
            log.warning("%s is outside what the local authority in this folder may vouch for (it was made for "
                        "other addresses): remove the folder to make a new one", ip)
        elif ip not in ips:
            ips.append(ip)
    host = socket.gethostname().split(".")[0].lower()
    return ips, ["localhost", *([f"{host}.local"] if host and host.isascii() and host != "localhost" else [])]


def _current(cert_file: Path, key_file: Path, ips: list[Address], dns: list[str]) -> bool:
    """Whether the kept server certificate names all of ``ips`` and ``dns`` and has time left."""
    from cryptography import x509

    if not (cert_file.exists() and key_file.exists()):
        return False
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    have = set(san.get_values_for_type(x509.IPAddress)) | set(san.get_values_for_type(x509.DNSName))
    left = cert.not_valid_after_utc - _now()
    return set(ips) | set(dns) <= have and left > datetime.timedelta(days=RENEW_DAYS)


def _issue(ca_key, ca_cert, ips: list[Address], dns: list[str], cert_file: Path, key_file: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns[-1])]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(hours=1))
            .not_valid_after(_now() + datetime.timedelta(days=SERVER_DAYS))
            .add_extension(x509.SubjectAlternativeName([*map(x509.IPAddress, ips), *map(x509.DNSName, dns)]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write_key(key_file, key)
    # The chain: the server's certificate, then the authority's (a client that has it installed finds it anyway).
    atomic_write(cert_file, cert.public_bytes(serialization.Encoding.PEM)
                       + ca_cert.public_bytes(serialization.Encoding.PEM))
