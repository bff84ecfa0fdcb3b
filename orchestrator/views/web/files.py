"""Files the web pages load: the pages themselves (beside this module) and, from the JavaScript SDK's
folder, its build (the browser bundle, ``dist/edgetrain.browser.mjs``) and onnxruntime-web's ``dist/``.
Nothing else under that folder is served: a path outside these roots is not found.

Each file is read and gzip-compressed once and served compressed to a browser whose
``Accept-Encoding`` takes gzip (onnxruntime-web's WebAssembly: 14.2 MB, 3.6 MB gzipped). A small
file is compressed on its first request; a large one (over :data:`COMPRESS_NOW`, such as the WebGPU
build's 27 MB WebAssembly) in a background thread, its plain bytes served until that is done: a
request must not wait seconds of compression, since websockets closes a connection whose HTTP
handling outlasts its opening timeout (the browser sees an empty response). The files the device
page's service worker keeps are compressed when the site starts (:meth:`SdkFiles.warm`). Every response carries an ``ETag``; a request that names it
(``If-None-Match``) gets ``304 Not Modified`` and no body. Pages and the SDK are revalidated on each
load (``no-cache``: a rebuilt SDK is seen at once), onnxruntime-web's files are kept a day; the device
page's service worker (``static/sw.js``) keeps all of them for the visits after the first."""

from __future__ import annotations

import asyncio
import email.utils
import functools
import gzip
import hashlib
import threading
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path

from websockets.datastructures import Headers
from websockets.http11 import Response

__all__ = ["ISOLATION", "Asset", "SdkFiles", "default_sdk_dir", "respond"]

STATIC = Path(__file__).resolve().parent / "static"

#: What makes a page cross-origin isolated, so WebAssembly may use threads (SharedArrayBuffer).
ISOLATION = {"Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp",
             "Cross-Origin-Resource-Policy": "same-origin"}

TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript", ".mjs": "text/javascript",
         ".css": "text/css", ".json": "application/json", ".wasm": "application/wasm",
         ".svg": "image/svg+xml", ".map": "application/json", ".png": "image/png",
         ".webmanifest": "application/manifest+json"}

#: URL prefix under /sdk/ -> folder under the SDK's root.
SDK_ROOTS = {"dist": "dist", "ort": "node_modules/onnxruntime-web/dist"}
#: The browser bundle the pages import (``npm run build`` writes it).
BUNDLE = "dist/edgetrain.browser.mjs"
#: The onnxruntime-web files the device page loads (its WebAssembly build, threads and SIMD).
ORT_FILES = ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
#: Types worth compressing (WebAssembly and text); images and shards are sent as they are.
COMPRESSIBLE = (".html", ".js", ".mjs", ".css", ".json", ".wasm", ".svg", ".map", ".webmanifest")
#: Files up to this size are compressed on their first request; larger ones in the background.
COMPRESS_NOW = 1 << 20
#: Cache-Control of what is revalidated on every load, and of onnxruntime-web's files.
REVALIDATE = "no-cache"
KEEP_A_DAY = "public, max-age=86400"


def default_sdk_dir() -> Path:
    """``edge_sdk_js`` beside the orchestrator package (a checkout of the repository)."""
    return Path(__file__).resolve().parents[3] / "edge_sdk_js"


def respond(status: int, body: bytes, content_type: str, *, cache: str = "no-store",
            extra: dict[str, str] | None = None, isolated: bool = True) -> Response:
    """An HTTP response with the isolation headers every page and file of the site carries (``extra``
    may replace one; ``isolated=False``: none, as for the plain-http install page)."""
    code = HTTPStatus(status)
    fields = {**(ISOLATION if isolated else {}), **(extra or {})}
    headers = Headers([("Date", email.utils.formatdate(usegmt=True)), ("Connection", "close"),
                       ("Content-Length", str(len(body))), ("Content-Type", content_type),
                       ("Cache-Control", cache), *fields.items()])
    return Response(code.value, code.phrase, headers, body)


@dataclass
class Asset:
    """A file as served: its bytes, their gzip form (None where it does not pay, or until it is made)
    and its ETag."""

    body: bytes
    etag: str
    content_type: str
    gzipped: bytes | None = field(default=None, repr=False)

    @classmethod
    def of(cls, path: Path) -> Asset:
        body = path.read_bytes()
        asset = cls(body, f'"{hashlib.sha256(body).hexdigest()[:20]}"', TYPES.get(path.suffix, "application/octet-stream"))
        if path.suffix in COMPRESSIBLE and len(body) > 1024:
            if len(body) <= COMPRESS_NOW:
                asset._pack()
            else:
                threading.Thread(target=asset._pack, name=f"gzip {path.name}", daemon=True).start()
        return asset

    def _pack(self) -> None:
        """Its gzip form, kept where it is smaller (level 9 for small files, 6 for large: nearly as small,
        several times faster)."""
        packed = gzip.compress(self.body, 9 if len(self.body) <= COMPRESS_NOW else 6, mtime=0)
        if len(packed) < len(self.body):
            self.gzipped = packed  # one assignment: a request sees the plain bytes or this

    def response(self, accept_encoding: str, if_none_match: str, cache: str) -> Response:
        """200 with the body (gzipped where the browser takes it), or 304 when it holds this version."""
        gz = self.gzipped is not None and accepts_gzip(accept_encoding)
        etag = self.etag[:-1] + '-gz"' if gz else self.etag
        extra = {"ETag": etag, "Vary": "Accept-Encoding"}
        if etag in {t.strip() for t in if_none_match.split(",")} or if_none_match.strip() == "*":
            response = respond(304, b"", self.content_type, cache=cache, extra=extra)
            del response.headers["Content-Length"]
            return response
        if gz:
            extra["Content-Encoding"] = "gzip"
        return respond(200, self.gzipped if gz else self.body, self.content_type, cache=cache,  # type: ignore[arg-type]
                       extra=extra)


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` header takes gzip (``gzip`` or ``*``, not at ``q=0``)."""
    for part in accept_encoding.lower().split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip() in ("gzip", "*"):
            q = params.strip().removeprefix("q=")
            try:
                return not params or float(q) > 0
            except ValueError:
                return False
    return False


class SdkFiles:
    """The site's files: pages from :data:`STATIC`, the SDK's from ``sdk_dir`` (read once, then kept)."""

    def __init__(self, sdk_dir: Path) -> None:
        self.sdk_dir = sdk_dir

    def warm(self) -> None:
        """Read (and start compressing) the files the device page loads, so its first visit need not wait."""
        paths = [self.sdk_dir / BUNDLE, *(self.sdk_dir / SDK_ROOTS["ort"] / name for name in ORT_FILES)]
        for path in paths:
            if path.is_file():
                self._asset(path.resolve(), path.stat().st_mtime_ns)

    def missing(self) -> str | None:
        """Why the device page cannot work (the SDK is not built or its packages not installed), if so."""
        for need in (BUNDLE, "node_modules/onnxruntime-web/dist"):
            if not (self.sdk_dir / need).exists():
                return (f"{self.sdk_dir / need} is missing: build the JavaScript SDK first "
                        f"(cd edge_sdk_js && ONNXRUNTIME_NODE_INSTALL=skip npm ci && npm run build)")
        return None

    async def page(self, name: str, headers: Headers | None = None) -> Response | None:
        return await self._file(STATIC, name, headers)

    async def sdk(self, rest: str, headers: Headers | None = None) -> Response | None:
        """``/sdk/<root>/<path>``: a file under one of :data:`SDK_ROOTS`."""
        root, _, path = rest.partition("/")
        if root not in SDK_ROOTS or not path:
            return None
        return await self._file((self.sdk_dir / SDK_ROOTS[root]).resolve(), path, headers,
                                cache=KEEP_A_DAY if root == "ort" else REVALIDATE)

    def precache(self) -> list[str]:
        """The URLs the device page's service worker keeps from its install on: the page, the run, the
        page's files, the SDK bundle and the onnxruntime-web files the page loads."""
        static = sorted(f"/static/{p.name}" for p in STATIC.iterdir() if p.is_file() and p.name != "sw.js")
        return ["/", "/web.json", *static, f"/sdk/{BUNDLE}", *(f"/sdk/ort/{name}" for name in ORT_FILES)]

    def version(self) -> str:
        """A digest of the precached files as they are now (size and time of change): the service worker's
        cache is named by it, so a changed page or SDK replaces every cached copy."""
        digest = hashlib.sha256()
        paths = [p for p in STATIC.iterdir() if p.is_file()] + [self.sdk_dir / BUNDLE] + [
            self.sdk_dir / SDK_ROOTS["ort"] / name for name in ORT_FILES]
        for path in sorted(paths):
            if path.is_file():
                stat = path.stat()
                digest.update(f"{path.name} {stat.st_size} {stat.st_mtime_ns}\n".encode())
        return digest.hexdigest()[:16]

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def _asset(path: Path, mtime_ns: int) -> Asset:  # keyed by mtime: a rebuilt file is read again
        return Asset.of(path)

    async def _file(self, base: Path, relative: str, headers: Headers | None, *,
                    cache: str = REVALIDATE) -> Response | None:
        path = (base / relative).resolve()
        if not path.is_relative_to(base) or not path.is_file():
            return None
        asset = await asyncio.to_thread(self._asset, path, path.stat().st_mtime_ns)
        h = headers or Headers()
        return asset.response(h.get("Accept-Encoding", ""), h.get("If-None-Match", ""), cache)
