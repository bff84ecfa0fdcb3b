"""Bytes, time and error of every transfer codec on real payloads of the zoo (bench/README.md, "Codecs").

For each model at a moderate device's split it builds, with the project's own code: the frozen chunk
(``export_chunk``: ONNX bytes), the tail the server sends (``encode_tensors`` of ``tail_state``), the
tail's training graph (``export_train_graph``) and a trained update (``train_tail``: tau = 10 steps of
batch 32, lr 0.05, momentum 0.9 on real data, from the seeded initial weights). Then:

- every payload through the lossless codecs (zlib and byte-shuffled zlib at levels 1, 6 and 9; zstd
  at levels 3 and 19, plain and shuffled, when the ``zstandard`` package is installed): bytes against
  the raw payload, encode and decode time in Python (median of ``--repeats``);
- the tail and the update through the lossy codecs, tensor by tensor (records summed; then through
  zlib as well): bytes, relative L2 error ``||decode - x|| / ||x||`` over the whole payload, and
  encode/decode time; in Node too (``--node``), decode and encode of the same records with the
  JavaScript SDK (edge_sdk_js must be built: ``npm run build``).

``python bench/codecs.py [--models digits_mlp:2,leaf_cnn:2,resnet20:7] [--repeats 3] [--node]``
writes bench/results/codecs.json and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edge_sdk.codecs import CODECS, codec, decode  # noqa: E402
from edge_sdk.codecs.lossless import shuffle  # noqa: E402
from edge_sdk.data.datasets import load_dataset  # noqa: E402
from edge_sdk.models import build_model  # noqa: E402
from edge_sdk.protocol import encode_tensors  # noqa: E402
from edge_sdk.trainer import tail_state, train_tail  # noqa: E402
from edge_sdk.training import TrainConfig  # noqa: E402
from exporters.onnx_export import export_chunk  # noqa: E402
from exporters.train_export import export_train_graph  # noqa: E402

DATASETS = {"digits_mlp": "digits", "leaf_cnn": "femnist", "resnet20": "cifar10"}
LOSSY = ["float16", "int8", "sr8", "sr4", "sr2", "eden4", "eden3", "eden2", "eden1"]
OUT = ROOT / "bench" / "results" / "codecs.json"


def payloads(name: str, split: int) -> dict[str, object]:
    """The four payload kinds of a device at ``split``: chunk and graph as bytes, tail and update as tensors."""
    model = build_model(name, seed=0)
    data = load_dataset(DATASETS[name], limit=512)
    chunk = export_chunk(model, 0, split)
    graph = export_train_graph(model, split)
    tail = {k: np.array(v, dtype=np.float32) for k, v in tail_state(model, split).items()  # a copy: training
            if v.dtype == np.float32}                                                    # overwrites the model
    with torch.no_grad():
        x = model(torch.from_numpy(np.asarray(data.x[:512], dtype=np.float32)), 0, split).numpy()
    result = train_tail(model, split, x, np.asarray(data.y[:512]), TrainConfig(local_steps=10, batch_size=32))
    update = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in result.deltas.items() if v.dtype == np.float32}
    return {"chunk": chunk, "graph": graph, "tail": tail, "update": update}


def timed(fn, repeats: int) -> tuple[object, float]:
    """The result of ``fn()`` and its median time in seconds."""
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def _lossless_methods() -> dict[str, tuple]:
    methods = {}
    for level in (1, 6, 9):
        methods[f"zlib-{level}"] = (lambda b, lv=level: zlib.compress(b, lv), zlib.decompress)
        methods[f"shuffle-{level}"] = (lambda b, lv=level: zlib.compress(shuffle(b, 4), lv), zlib.decompress)
    try:
        import zstandard
    except ImportError:
        return methods
    for level in (3, 19):
        methods[f"zstd-{level}"] = (lambda b, lv=level: zstandard.ZstdCompressor(level=lv).compress(b),
                                    lambda b: zstandard.ZstdDecompressor().decompress(b))
        methods[f"shuffle-zstd-{level}"] = (lambda b, lv=level: zstandard.ZstdCompressor(level=lv).compress(shuffle(b, 4)),
                                            lambda b: zstandard.ZstdDecompressor().decompress(b))
    return methods


def lossless(raw: bytes, repeats: int) -> dict[str, dict]:
    """Bytes and times of each lossless method on one byte payload (the codec records add 12-16 bytes)."""
    rows = {}
    for name, (enc, dec) in _lossless_methods().items():
        packed, t_enc = timed(lambda: enc(raw), repeats)
        _, t_dec = timed(lambda: dec(packed), repeats)
        rows[name] = {"bytes": len(packed), "ratio": len(packed) / len(raw), "encode_s": t_enc, "decode_s": t_dec}
    return rows


def lossy(tensors: dict[str, np.ndarray], repeats: int) -> dict[str, dict]:
    """Each lossy codec tensor by tensor: record bytes (and deflated), relative L2 error, times."""
    raw = sum(v.nbytes for v in tensors.values())
    norm = np.sqrt(sum(float((v.astype(np.float64) ** 2).sum()) for v in tensors.values()))
    rows = {}
    for name in LOSSY:
        c = CODECS[name]
        seeded = name.startswith("eden")  # a rotation seed travels in the record; rounding draws os.urandom
        records, t_enc = timed(lambda: {k: c.encode(v, seed=i if seeded else None) for i, (k, v) in
                                        enumerate(tensors.items())}, repeats)
        back, t_dec = timed(lambda: {k: decode(r) for k, r in records.items()}, repeats)
        size = sum(len(r) for r in records.values())
        err = np.sqrt(sum(float(((back[k].astype(np.float64) - v) ** 2).sum()) for k, v in tensors.items()))
        deflated = sum(len(zlib.compress(r, 6)) for r in records.values())
        rows[name] = {"bytes": size, "ratio": size / raw, "zlib_ratio": deflated / raw,
                      "rel_l2": err / norm if norm else 0.0, "encode_s": t_enc, "decode_s": t_dec}
    return rows


NODE_SCRIPT = r"""
import { readFileSync } from "node:fs";
const { codecs } = await import(process.argv[2]);
const cases = JSON.parse(readFileSync(process.argv[3], "utf8"));
const out = {};
for (const c of cases) {
  const records = c.records.map((f) => new Uint8Array(readFileSync(f)));
  const med = (fn) => { const t = []; for (let i = 0; i < c.repeats; i++) { const s = performance.now(); fn(); t.push(performance.now() - s); } t.sort((a, b) => a - b); return t[t.length >> 1] / 1000; };
  const tensors = records.map((r) => codecs.decode(r));
  const decode_s = med(() => records.forEach((r) => codecs.decode(r)));
  const seeded = c.codec.startsWith("eden"); // rounding draws crypto.getRandomValues, as in production
  const encode_s = med(() => tensors.forEach((t, i) => codecs.codec(c.codec).encode(t, seeded ? { seed: i } : {})));
  out[c.key] = { decode_s, encode_s };
}
console.log(JSON.stringify(out));
"""


def node_times(payload: dict[str, dict[str, np.ndarray]], repeats: int) -> dict[str, dict]:
    """Decode and encode time of the JavaScript codecs on the same tensors (float32 inputs re-encoded there)."""
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        for kind, tensors in payload.items():
            for name in ["zlib", "shuffle", *LOSSY]:
                files = []
                for i, (k, v) in enumerate(tensors.items()):
                    path = Path(tmp) / f"{kind}-{name}-{i}.rec"
                    path.write_bytes(CODECS[name].encode(v, seed=i))
                    files.append(str(path))
                cases.append({"key": f"{kind}/{name}", "codec": name, "records": files, "repeats": repeats})
        (Path(tmp) / "cases.json").write_text(json.dumps(cases))
        (Path(tmp) / "run.mjs").write_text(NODE_SCRIPT)
        index = (ROOT / "edge_sdk_js" / "dist" / "index.js").as_uri()
        out = subprocess.run(["node", str(Path(tmp) / "run.mjs"), index, str(Path(tmp) / "cases.json")],
                             capture_output=True, text=True, check=True, cwd=ROOT / "edge_sdk_js")
        return json.loads(out.stdout.strip().splitlines()[-1])


def web_assets() -> dict[str, dict]:
    """The browser's first-visit downloads (the SDK's WebAssembly) through deflate at level 9, as an
    HTTP server's gzip content encoding would send them."""
    rows = {}
    for path in sorted((ROOT / "edge_sdk_js" / "node_modules" / "onnxruntime-web" / "dist").glob("*.wasm")):
        raw = path.read_bytes()
        rows[path.name] = {"bytes": len(raw), "deflate9": len(zlib.compress(raw, 9))}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="digits_mlp:2,leaf_cnn:2,resnet20:7")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--node", action="store_true", help="time the JavaScript codecs too")
    args = parser.parse_args()
    torch.manual_seed(0)
    results = {"machine": platform.platform(), "python": platform.python_version(), "numpy": np.__version__,
               "date": time.strftime("%Y-%m-%d"), "models": {}, "web_assets": web_assets()}
    for spec in args.models.split(","):
        name, split = spec.split(":")
        p = payloads(name, int(split))
        entry = {"split": int(split)}
        for kind in ("chunk", "graph"):
            entry[kind] = {"raw": len(p[kind]), "lossless": lossless(p[kind], args.repeats)}
        for kind in ("tail", "update"):
            raw = encode_tensors(p[kind])
            entry[kind] = {"raw": len(raw), "lossless": lossless(raw, args.repeats), "lossy": lossy(p[kind], args.repeats)}
        if args.node:
            entry["node"] = node_times({"tail": p["tail"], "update": p["update"]}, args.repeats)
        results["models"][spec] = entry
        report(spec, entry)
    OUT.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


def report(spec: str, entry: dict) -> None:
    print(f"\n## {spec}")
    for kind in ("chunk", "graph", "tail", "update"):
        rows = entry[kind]["lossless"]
        print(f"{kind} ({entry[kind]['raw'] / 1e6:.2f} MB): " + ", ".join(
            f"{n} {r['ratio']:.3f} ({r['encode_s'] * 1e3:.0f}/{r['decode_s'] * 1e3:.0f} ms)" for n, r in rows.items()))
    for key, r in entry.get("node", {}).items():
        if key.split("/")[1] in ("zlib", "shuffle"):
            print(f"  node {key}: encode {r['encode_s'] * 1e3:.0f} ms, decode {r['decode_s'] * 1e3:.0f} ms")
    for kind in ("tail", "update"):
        for n, r in entry[kind]["lossy"].items():
            node = entry.get("node", {}).get(f"{kind}/{n}", {})
            extra = f", node {node['encode_s'] * 1e3:.0f}/{node['decode_s'] * 1e3:.0f} ms" if node else ""
            print(f"  {kind} {n:8s} ratio {r['ratio']:.4f} (+zlib {r['zlib_ratio']:.4f}) rel L2 {r['rel_l2']:.4g} "
                  f"enc/dec {r['encode_s'] * 1e3:.0f}/{r['decode_s'] * 1e3:.0f} ms{extra}")


if __name__ == "__main__":
    main()
