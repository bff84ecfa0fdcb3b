"""Files the web pages load: the pages themselves (beside this module) and, from the JavaScript SDK's
folder, its build and the three packages a browser needs (msgpack, hashes, onnxruntime-web). Nothing
else under that folder is served: a path outside these roots is not found."""

from __future__ import annotations

import email.utils
import functools
from http import HTTPStatus
from pathlib import Path

from websockets.datastructures import Headers
from websockets.http11 import Response

__all__ = ["ISOLATION", "SdkFiles", "default_sdk_dir", "respond"]

STATIC = Path(__file__).resolve().parent / "static"

#: What makes a page cross-origin isolated, so WebAssembly may use threads (SharedArrayBuffer).
ISOLATION = {"Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp",
             "Cross-Origin-Resource-Policy": "same-origin"}

TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript", ".mjs": "text/javascript",
         ".css": "text/css", ".json": "application/json", ".wasm": "application/wasm",
         ".svg": "image/svg+xml", ".map": "application/json"}

#: URL prefix under /sdk/ -> folder under the SDK's root.
SDK_ROOTS = {"dist": "dist", "msgpack": "node_modules/@msgpack/msgpack", "hashes": "node_modules/@noble/hashes",
             "ort": "node_modules/onnxruntime-web/dist"}


def default_sdk_dir() -> Path:
    """``edge_sdk_js`` beside the orchestrator package (a checkout of the repository)."""
    return Path(__file__).resolve().parents[2] / "edge_sdk_js"


def respond(status: int, body: bytes, content_type: str, *, cache: bool = False,
            extra: dict[str, str] | None = None) -> Response:
    """An HTTP response with the isolation headers every page and file of the site carries."""
    code = HTTPStatus(status)
    headers = Headers([("Date", email.utils.formatdate(usegmt=True)), ("Connection", "close"),
                       ("Content-Length", str(len(body))), ("Content-Type", content_type),
                       ("Cache-Control", "max-age=3600" if cache else "no-store"),
                       *ISOLATION.items(), *(extra or {}).items()])
    return Response(code.value, code.phrase, headers, body)


class SdkFiles:
    """The site's files: pages from :data:`STATIC`, the SDK's from ``sdk_dir`` (read once, then kept)."""

    def __init__(self, sdk_dir: Path) -> None:
        self.sdk_dir = sdk_dir

    def missing(self) -> str | None:
        """Why the device page cannot work (the SDK is not built or its packages not installed), if so."""
        for need in ("dist/index.js", "node_modules/onnxruntime-web/dist", "node_modules/@msgpack/msgpack"):
            if not (self.sdk_dir / need).exists():
                return (f"{self.sdk_dir / need} is missing: build the JavaScript SDK first "
                        f"(cd edge_sdk_js && ONNXRUNTIME_NODE_INSTALL=skip npm ci && npm run build)")
        return None

    def page(self, name: str) -> Response | None:
        return self._file(STATIC, name)

    def sdk(self, rest: str) -> Response | None:
        """``/sdk/<root>/<path>``: a file under one of :data:`SDK_ROOTS`."""
        root, _, path = rest.partition("/")
        if root not in SDK_ROOTS or not path:
            return None
        return self._file((self.sdk_dir / SDK_ROOTS[root]).resolve(), path, cache=root != "dist")

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def _read(path: Path) -> bytes:
        return path.read_bytes()

    def _file(self, base: Path, relative: str, *, cache: bool = False) -> Response | None:
        path = (base / relative).resolve()
        if not path.is_relative_to(base) or not path.is_file():
            return None
        return respond(200, self._read(path), TYPES.get(path.suffix, "application/octet-stream"), cache=cache)
