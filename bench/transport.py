"""Transport benchmark: the wire protocol against bare websockets on 127.0.0.1.

    python bench/transport.py [--sizes 1,10,100] [--repeats 15] [--frame-size 262144]

For each size (MiB of float32), a server process streams one tensor to a client in this process,
in four ways measured in the same run and interleaved (the order rotates every repeat):

- protocol: ``encode_tensors`` -> ``send_payload`` (TransferBegin, frames hashed as they go out,
  TransferEnd with the digest)
  over websockets opened with ``ws_options`` -> ``recv_payload`` (IncomingTransfer, sha256 check)
  -> ``decode_tensors`` (dtype, shape and NaN/Inf checks). Timed from the client's request to the
  decoded arrays. This is a device uploading its update: encoded and hashed for one transfer.
- protocol, cached: the same, but the payload and its sha256 were computed once beforehand (the
  digest travels in TransferBegin), as the orchestrator does for the chunks and tails it streams
  to many devices in a round.
- bare: websockets in its fastest configuration (compression off, size limit off, the raw tensor
  bytes as one message) -> ``numpy.frombuffer``. Timed the same way.
- sha256 floor: the simplest transfer checked by a sha256 over websockets: bare websockets (same
  settings) sending the raw bytes as one message in fragments of the protocol's frame size; the
  receiver copies each fragment into its buffer and hashes it as it lands, checks the digest and
  takes ``numpy.frombuffer``. No msgpack, no messages, no thread. The protocol's spec asks for this
  sha256 (docs/protocol.md, "Transfers"), so floor/bare shows how close to bare a conforming
  protocol can come on this machine.

It prints MiB/s (median of the repeats), protocol/bare (target >= 0.8), floor/bare, cached/floor
(how much of what a sha256-checked transfer can do the server's path does), the in-process speed
of ``encode_tensors``, ``decode_tensors`` and sha256, and writes bench/results/transport.json.

The CPU time of each method in both processes is printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import multiprocessing
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import websockets
from rich.console import Console
from rich.table import Table
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Case, Context, interleave, parse_list, ratio_summary  # noqa: E402
from edge_sdk.protocol import (  # noqa: E402
    DEFAULT_FRAME_SIZE,
    Limits,
    TransferBegin,
    decode_tensors,
    encode_tensors,
    sha256_hex,
)
from edge_sdk.transport import recv_msg, recv_payload, send_payload, ws_options  # noqa: E402

MIB = 1 << 20
#: Bare websockets, fastest settings: no compression, no size limit, one message per tensor.
BARE_OPTIONS = {"compression": None, "max_size": None, "ping_interval": None}


def _limits(frame_size: int, largest: int) -> Limits:
    return Limits(max_frame_bytes=frame_size, max_transfer_bytes=largest + MIB, max_tensor_bytes=largest + MIB)


def _tensor(size_mib: int) -> np.ndarray:
    return np.random.default_rng(size_mib).standard_normal(size_mib * MIB // 4, dtype=np.float32)


def _server(conn, sizes: list[int], frame_size: int) -> None:
    """Server process: a protocol server and a bare server; a text request names method and size."""
    tensors = {size: _tensor(size) for size in sizes}
    payloads = {size: encode_tensors({"weights": tensors[size]}) for size in sizes}
    digests = {size: sha256_hex(payloads[size]) for size in sizes}
    limits = _limits(frame_size, max(sizes) * MIB)

    async def handler(ws) -> None:
        """Both servers run this; each is asked only for the methods its websocket settings suit."""
        async for request in ws:
            if request == "cpu":
                await ws.send(repr(time.process_time()))
                continue
            method, size = request.split()
            data = memoryview(tensors[int(size)]).cast("B")
            if method == "bare":
                await ws.send(data)
            elif method == "floor":  # one message in fragments of the frame size
                await ws.send(data[i:i + frame_size] for i in range(0, len(data), frame_size))
            else:
                if method == "cached":  # encoded and hashed once, streamed many times (the orchestrator)
                    payload, digest = payloads[int(size)], digests[int(size)]
                else:  # encoded and hashed for this transfer (a device's update)
                    payload, digest = encode_tensors({"weights": tensors[int(size)]}), None
                await send_payload(ws, payload, transfer_id=f"bench-{size}", kind="chunk",
                                   meta={"size_mib": int(size)}, frame_size=frame_size, sha256=digest)

    async def main() -> None:
        async with serve(handler, "127.0.0.1", 0, **ws_options(limits)) as proto, \
                serve(handler, "127.0.0.1", 0, **BARE_OPTIONS) as bare:
            conn.send((proto.sockets[0].getsockname()[1], bare.sockets[0].getsockname()[1]))
            await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # until told to stop

    asyncio.run(main())


METHODS = ("protocol", "cached", "bare", "floor")


async def _measure(proto_port: int, bare_port: int, sizes: list[int], repeats: int,
                   frame_size: int) -> tuple[dict[int, dict[str, list[float]]], dict[int, dict[str, dict[str, float]]]]:
    """Seconds per transfer for each size and method (interleaved), then CPU seconds per transfer."""
    limits = _limits(frame_size, max(sizes) * MIB)
    expected = {size: hashlib.sha256(_tensor(size)).hexdigest() for size in sizes}  # the floor's digest
    times: dict[int, dict[str, list[float]]] = {size: {m: [] for m in METHODS} for size in sizes}
    cpu: dict[int, dict[str, dict[str, float]]] = {size: {} for size in sizes}
    async with connect(f"ws://127.0.0.1:{proto_port}", **ws_options(limits)) as proto, \
            connect(f"ws://127.0.0.1:{bare_port}", **BARE_OPTIONS) as bare:

        async def via_protocol(method: str, size: int) -> float:
            start = time.perf_counter()
            await proto.send(f"{method} {size}")
            begin = await recv_msg(proto, limits)
            assert isinstance(begin, TransferBegin)
            arrays = decode_tensors(await recv_payload(proto, begin, limits), limits)
            elapsed = time.perf_counter() - start
            assert arrays["weights"].nbytes == size * MIB
            return elapsed

        async def via_bare(method: str, size: int) -> float:
            start = time.perf_counter()
            await bare.send(f"bare {size}")
            array = np.frombuffer(await bare.recv(), dtype=np.float32)
            elapsed = time.perf_counter() - start
            assert array.nbytes == size * MIB
            return elapsed

        async def via_floor(method: str, size: int) -> float:
            start = time.perf_counter()
            await bare.send(f"floor {size}")
            buffer, digest, offset = np.empty(size * MIB, dtype=np.uint8), hashlib.sha256(), 0
            async for fragment in bare.recv_streaming():
                end = offset + len(fragment)
                buffer[offset:end] = np.frombuffer(fragment, dtype=np.uint8)
                digest.update(buffer[offset:end])
                offset = end
            if digest.hexdigest() != expected[size]:
                raise AssertionError("sha256 mismatch")
            array = buffer.view(np.float32)
            elapsed = time.perf_counter() - start
            assert array.nbytes == size * MIB
            return elapsed

        async def server_cpu(ws) -> float:
            await ws.send("cpu")
            return float(await ws.recv())

        run = {"protocol": via_protocol, "cached": via_protocol, "bare": via_bare, "floor": via_floor}
        for size in sizes:  # one size at a time, so that a 100 MiB run does not disturb a 1 MiB one
            for method in METHODS:  # warm-up: allocator, socket buffers
                await run[method](method, size)
            for _, method in interleave(METHODS, repeats):
                times[size][method].append(await run[method](method, size))
            block = max(3, 200 // size)  # enough back-to-back transfers to time small CPU costs
            for method in METHODS:
                ws = bare if method in ("bare", "floor") else proto
                client, server = time.process_time(), await server_cpu(ws)
                for _ in range(block):
                    await run[method](method, size)
                cpu[size][method] = {"client": (time.process_time() - client) / block,
                                     "server": (await server_cpu(ws) - server) / block}
    return times, cpu


def _codec_speed(sizes: list[int], repeats: int) -> dict[int, dict[str, float]]:
    """In-process MiB/s of encode_tensors, decode_tensors (checks included) and sha256."""
    out = {}
    for size in sizes:
        tensor = {"weights": _tensor(size)}
        limits = _limits(DEFAULT_FRAME_SIZE, size * MIB)
        enc, dec, sha = [], [], []
        for _ in range(max(repeats, 3)):
            start = time.perf_counter()
            payload = encode_tensors(tensor)
            enc.append(time.perf_counter() - start)
            start = time.perf_counter()
            decode_tensors(payload, limits)
            dec.append(time.perf_counter() - start)
            start = time.perf_counter()
            sha256_hex(payload)
            sha.append(time.perf_counter() - start)
        out[size] = {"encode_mib_s": size / statistics.median(enc), "decode_mib_s": size / statistics.median(dec),
                     "sha256_mib_s": size / statistics.median(sha)}
    return out


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="1,10,100", help="tensor sizes in MiB, comma-separated")
    parser.add_argument("--frame-size", type=int, default=DEFAULT_FRAME_SIZE, help="protocol frame size in bytes")


def run(context: Context) -> dict:
    args = context.args
    sizes = parse_list(args.sizes, int)

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    server = ctx.Process(target=_server, args=(child, sizes, args.frame_size), daemon=True)
    server.start()
    try:
        proto_port, bare_port = parent.recv()
        times, cpu = asyncio.run(_measure(proto_port, bare_port, sizes, args.repeats, args.frame_size))
    finally:
        parent.send("stop")
        server.join(timeout=10)
        if server.is_alive():
            server.terminate()
    codec = _codec_speed(sizes, args.repeats)

    rows = []
    for size in sizes:
        speed = {m: size / statistics.median(times[size][m]) for m in METHODS}
        rows.append({"size_mib": size, "bare_mib_s": speed["bare"], "floor_mib_s": speed["floor"],
                     "protocol_mib_s": speed["protocol"], "cached_mib_s": speed["cached"],
                     "floor_ratio": speed["floor"] / speed["bare"], "ratio": speed["protocol"] / speed["bare"],
                     "cached_ratio": speed["cached"] / speed["bare"], "cached_of_floor": speed["cached"] / speed["floor"],
                     "cpu_ms": {m: {k: v * 1e3 for k, v in cpu[size][m].items()} for m in METHODS},
                     **codec[size], "seconds": times[size]})

    def ratio(value: float) -> str:
        style = "green" if value >= 0.8 else "red"
        return f"[{style}]{value:.2f}[/{style}]"

    table = Table(title=f"Transport on 127.0.0.1: MiB/s, median of {args.repeats} (frame {args.frame_size} B)")
    for column in ("size", "bare websockets", "sha256 floor", "floor/bare", "protocol", "protocol/bare",
                   "protocol, cached", "cached/bare", "cached/floor", "encode_tensors", "decode_tensors", "sha256"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(f"{row['size_mib']} MiB", f"{row['bare_mib_s']:.0f}", f"{row['floor_mib_s']:.0f}",
                      ratio(row["floor_ratio"]), f"{row['protocol_mib_s']:.0f}", ratio(row["ratio"]),
                      f"{row['cached_mib_s']:.0f}", ratio(row["cached_ratio"]), f"{row['cached_of_floor']:.2f}",
                      f"{row['encode_mib_s']:.0f}", f"{row['decode_mib_s']:.0f}", f"{row['sha256_mib_s']:.0f}")
    console = Console(width=180)
    console.print(table)
    cpu_table = Table(title="CPU ms per transfer (client process incl. its threads + server process)")
    cpu_table.add_column("size", justify="right")
    for method in METHODS:
        cpu_table.add_column(method, justify="right")
    cpu_table.add_column("sha256 alone", justify="right")
    for row in rows:
        cells = [f"{c['client']:.2f} + {c['server']:.2f}" for c in (row["cpu_ms"][m] for m in METHODS)]
        cpu_table.add_row(f"{row['size_mib']} MiB", *cells, f"{row['size_mib'] / row['sha256_mib_s'] * 1e3:.2f}")
    console.print(cpu_table)

    runs = [{"size_mib": size, "lane": m, "repeat": rep, "seconds": t, "mib_s": size / t}
            for size in sizes for m in METHODS for rep, t in enumerate(times[size][m])]
    ratios = {f"mib_s_over_{base}": ratio_summary(runs, "mib_s", base, by=("size_mib",)) for base in ("bare", "floor")}
    return context.write(runs, {"frame_size": args.frame_size, "bare_options": dict(BARE_OPTIONS),
                                "versions": {"python": platform.python_version(), "websockets": websockets.__version__,
                                             "numpy": np.__version__}, "rows": rows}, ratios)


CASE = Case("transport", __doc__, run, arguments=arguments, repeats=15, quick={"sizes": "1", "repeats": 2},
            metrics=("mib_s",), group_by=("size_mib", "lane"))


def main(argv: list[str] | None = None) -> dict:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
