"""Scale: 100, 1,000 and 10,000 devices held and sampled by one orchestrator process.

Lightweight devices (the real :class:`edge_sdk.client.DeviceClient`, many per worker process, run by
:func:`emulator.lightweight.run_worker`) connect to one orchestrator process on
127.0.0.1, say hello, keep their connections alive with the websockets heartbeat (a ping every 20 s
each way, the production setting) and are sampled 100 per round (FedAvg, the ``tiny`` model,
synthetic data). Devices arrive at ``--rate`` per second over the whole fleet (100 by default: 10,000
devices in 100 s; ``--rate 0`` starts every device at once, a fleet reconnecting after a restart).
Per fleet size it reports:

- connect: wall time until every device has its welcome, the server's CPU meanwhile;
- hello-to-welcome latency, p50/p99: measured by the server (hello read to welcome written) and by the
  devices (connection opened to welcome received: TCP and websocket handshakes, queueing, hello);
- server RSS before any device, with every device connected (and per device), and its peak;
- server CPU at rest (every device connected, heartbeats only), as a share of one core;
- per round: wall time and the server's CPU (round metrics ``round_wall_s``, ``server_cpu_s``);
- shutdown: the server's goodbye to every device at once, until it stopped serving;

and how each grows from one size to the next (ratios 1k/100, 10k/1k). Writes
``bench/results/scale.json``. The server and the worker processes raise their descriptor limit to
the hard limit (:func:`orchestrator.server.limits.raise_fd_limit`). Not a test: the numbers depend on how
busy the machine is; run ``python bench/scale.py [--sizes 100,1000,10000] [--rounds 3] [--rate 100]``.

``--profile DIR`` writes a cProfile of each server process to DIR/server-N.prof.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Case, Context, parse_list  # noqa: E402

HERE = Path(__file__).resolve()
SHARDS = 100  # the synthetic set has 400 training samples: devices share 100 shards of 4


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


# -- the orchestrator process ------------------------------------------------------------------------
def serve(args: argparse.Namespace) -> None:
    """One orchestrator: waits for ``--devices``, reports, holds the first round until told on stdin."""
    from orchestrator.config import ServerConfig
    from orchestrator.server import Orchestrator
    from orchestrator.server.limits import raise_fd_limit

    n = args.devices
    out = sys.stdout

    def say(kind: str, **data: object) -> None:
        out.write(json.dumps({"event": kind, "t": time.monotonic(), **data}) + "\n")
        out.flush()

    latencies: list[float] = []
    failures: dict[str, int] = {}

    def on_event(kind: str, data: dict) -> None:
        if kind == "welcomed":
            latencies.append(float(data["latency_s"]))
            if len(latencies) == n:
                say("all_welcomed", hello_to_welcome_s=latencies)
        elif kind == "round_end":
            say("round_end", metrics={k: data[k] for k in ("round", "selected", "reported", "round_wall_s",
                                                           "server_cpu_s", "stragglers") if k in data})
        elif kind == "round_start":
            say("round_start", round=data["round"], selected=data["selected"])
        elif kind in ("rejected", "over_budget", "round_failed"):
            failures[kind] = failures.get(kind, 0) + 1

    config = ServerConfig(
        model="tiny", strategy="fedavg", rounds=args.rounds, fraction=min(1.0, args.per_round / n), min_devices=n,
        deadline_s=300, wait_devices_s=1800, local_steps=2, batch_size=4, lr=0.05, momentum=0.0, weight_decay=0.0,
        eval_every=0, eval_data="synthetic", store_dir=Path(args.store), max_connections=max(20_000, 2 * n),
        hello_timeout_s=120,
    )

    async def main() -> None:
        before = raise_fd_limit()
        orch = Orchestrator(config, on_event=on_event)
        ready, start = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(orch.run(ready=ready, start=start))
        await ready.wait()
        import resource

        say("listening", port=orch.port, pid=os.getpid(), nofile=list(resource.getrlimit(resource.RLIMIT_NOFILE)),
            nofile_before=list(before))
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while (line := await reader.readline()) and line.strip() != b"start":
            pass
        start.set()
        history = await task
        transport.close()
        say("done", rounds=len(history), failures=failures)

    if args.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
        try:
            asyncio.run(main())
        finally:
            prof.disable()
            prof.dump_stats(args.profile)
    else:
        asyncio.run(main())


# -- a worker process of devices ---------------------------------------------------------------------
def work(args: argparse.Namespace) -> None:
    """The lightweight worker (run_worker), with each device's connect-to-welcome time kept here."""
    from emulator.lightweight import WorkerSpec, load_runtimes, run_worker
    from orchestrator.server.limits import raise_fd_limit

    raise_fd_limit()
    spec = WorkerSpec.from_json(Path(args.spec_file).read_text())
    load_runtimes()
    started: dict[str, float] = {}
    latency: list[float] = []
    lost: dict[str, int] = {}

    def say(kind: str, **data: object) -> None:
        sys.stdout.write(json.dumps({"event": kind, **data}) + "\n")
        sys.stdout.flush()

    def emit(kind: str, data: dict) -> None:
        now = time.monotonic()
        if kind == "life_start":
            started[data["device"]] = now
        elif kind == "welcome":
            t0 = started.pop(data["device"], None)
            if t0 is not None:
                latency.append(now - t0)
                if len(latency) == len(spec.devices):
                    say("all_welcomed", connect_to_welcome_s=latency)
        elif kind == "reconnect":
            lost["reconnects"] = lost.get("reconnects", 0) + 1
            started.setdefault(data["device"], now)
        elif kind == "life_end" and data.get("ended") != "finished":
            lost[data["ended"]] = lost.get(data["ended"], 0) + 1
            if data.get("error") and lost[data["ended"]] <= 3:
                say("device_failed", device=data["device"], error=data["error"])
        elif kind == "worker_exit":
            parts_left[0] -= 1
            if parts_left[0] == 0:
                say(kind, **data, lost=lost)

    # The fleet arrives at --rate devices per second (this worker's share of it), in groups of
    # 0.2 s, each group run by run_worker; 0: every device at once.
    rate = args.rate / args.workers_total
    size = len(spec.devices) if rate <= 0 else max(1, round(rate * 0.2))
    parts = [spec.devices[i:i + size] for i in range(0, len(spec.devices), size)]
    parts_left = [len(parts)]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        say("loaded", devices=len(spec.devices))
        await reader.readline()  # "go": every worker starts together
        stopped = asyncio.Event()

        async def stdin_closed() -> None:
            while await reader.readline():
                pass
            stopped.set()

        watcher = asyncio.create_task(stdin_closed())
        t0 = time.monotonic()
        runs = []
        for i, part in enumerate(parts):
            await asyncio.sleep(max(0.0, t0 + i * 0.2 - time.monotonic()) if rate > 0 else 0)
            runs.append(asyncio.create_task(run_worker(replace(spec, devices=tuple(part)), args.url, emit=emit,
                                                       stop=stopped.wait)))
        await asyncio.gather(*runs)
        watcher.cancel()
        transport.close()

    asyncio.run(main())


# -- the driver ----------------------------------------------------------------------------------------
class Proc:
    """A child process whose stdout is JSON lines, read into a queue."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc, self.name = proc, name
        self.events: asyncio.Queue[dict] = asyncio.Queue()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            with contextlib.suppress(json.JSONDecodeError):
                await self.events.put(json.loads(line))
        await self.events.put({"event": "eof"})

    async def expect(self, kind: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.name}: no {kind} within {timeout:.0f} s")
            ev = await asyncio.wait_for(self.events.get(), timeout=left)
            if ev["event"] == kind:
                return ev
            if ev["event"] == "eof":
                raise RuntimeError(f"{self.name} ended before {kind} (rc {await self.proc.wait()})")
            if ev["event"] == "device_failed":
                print(f"  {self.name}: {ev['device']} failed: {ev['error']}", file=sys.stderr)


async def spawn(argv: list[str], name: str, log: Path) -> Proc:
    from emulator.localfleet import device_env

    with open(log, "ab") as err:
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, stderr=err, env=device_env(),
                                                    limit=64 << 20)
    return Proc(proc, name)


async def run_size(n: int, args: argparse.Namespace, tmp: Path) -> dict:
    from edge_sdk.memory import cpu_seconds, process_memory
    from emulator.launch import DeviceLaunch
    from emulator.lightweight import WorkerDevice, WorkerSpec, split_devices

    workers = max(1, min(args.workers, n))
    log = tmp / f"logs-{n}"
    log.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(HERE), "--serve", "--devices", str(n), "--rounds", str(args.rounds),
            "--per-round", str(args.per_round), "--store", str(tmp / f"store-{n}")]
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        argv += ["--profile-file", str(Path(args.profile) / f"server-{n}.prof")]
    server = await spawn(argv, f"server({n})", log / "server.log")
    listening = await server.expect("listening", 120)
    pid, url = listening["pid"], f"ws://127.0.0.1:{listening['port']}"
    await asyncio.sleep(0.5)
    rss_empty = process_memory(pid).rss_bytes
    launches = [WorkerDevice(DeviceLaunch(f"d{i:05d}", 512 << 20, client=i % SHARDS, num_clients=SHARDS,
                                          data="synthetic", device_class="phone", backend="torch"))
                for i in range(n)]
    procs = []
    for w, share in enumerate(split_devices(launches, workers)):
        spec = tmp / f"worker-{n}-{w}.json"
        spec.write_text(WorkerSpec(w, tuple(share), threads=1, stop_grace_s=30.0).to_json())
        procs.append(await spawn([sys.executable, str(HERE), "--work", "--url", url, "--spec-file", str(spec),
                                  "--rate", str(args.rate), "--workers-total", str(workers)],
                                 f"worker{w}({n})", log / f"worker-{w}.log"))
    for p in procs:  # runtimes imported: devices start connecting together, at --rate
        await p.expect("loaded", 300)
    t0, cpu0 = time.monotonic(), cpu_seconds(pid)
    for p in procs:
        assert p.proc.stdin is not None
        p.proc.stdin.write(b"go\n")
        await p.proc.stdin.drain()
    peak = rss_empty

    async def sample_peak() -> None:
        nonlocal peak
        while True:
            with contextlib.suppress(ProcessLookupError):
                peak = max(peak, process_memory(pid).rss_bytes)
            await asyncio.sleep(0.25)

    sampler = asyncio.create_task(sample_peak())
    welcomed = await server.expect("all_welcomed", args.connect_timeout)
    connect_s, connect_cpu = welcomed["t"] - t0, cpu_seconds(pid) - cpu0
    device_lat: list[float] = []
    for p in procs:
        device_lat += (await p.expect("all_welcomed", 120))["connect_to_welcome_s"]
    await asyncio.sleep(args.settle_s)
    rss_connected = process_memory(pid).rss_bytes
    i0, icpu0 = time.monotonic(), cpu_seconds(pid)
    wcpu0 = sum(cpu_seconds(p.proc.pid) for p in procs)
    await asyncio.sleep(args.idle_s)
    idle_wall = time.monotonic() - i0
    idle_cpu = cpu_seconds(pid) - icpu0
    workers_idle_cpu = sum(cpu_seconds(p.proc.pid) for p in procs) - wcpu0
    rss_idle = process_memory(pid).rss_bytes

    assert server.proc.stdin is not None
    server.proc.stdin.write(b"start\n")
    await server.proc.stdin.drain()
    rounds = []
    for _ in range(args.rounds):
        last = await server.expect("round_end", 600)
        rounds.append(last["metrics"])
    t_bye = time.monotonic()
    done = await server.expect("done", 600)
    bye_server_s = done["t"] - last["t"]  # the server's goodbye to everyone, until it stopped serving
    exits = []
    for p in procs:
        ev = await p.expect("worker_exit", 600)
        exits.append(ev)
        if p.proc.stdin is not None:
            p.proc.stdin.close()
    bye_s = time.monotonic() - t_bye
    sampler.cancel()
    server_peak = max(peak, process_memory(pid).peak_rss_bytes) if server.proc.returncode is None else peak
    with contextlib.suppress(ProcessLookupError):
        server_peak = max(server_peak, process_memory(pid).peak_rss_bytes)
    for p in [server, *procs]:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(p.proc.wait(), 60)
        if p.proc.returncode is None:
            p.proc.kill()
            await p.proc.wait()
    server_lat = welcomed["hello_to_welcome_s"]
    warm = rounds[1:] or rounds
    lost: dict[str, int] = {}
    for ev in exits:
        for k, v in ev.get("lost", {}).items():
            lost[k] = lost.get(k, 0) + v
    return {
        "devices": n, "workers": workers, "rounds": rounds, "lost": lost, "failures": done.get("failures", {}),
        "nofile": listening["nofile"], "nofile_before": listening["nofile_before"],
        "connect_s": round(connect_s, 3), "connect_server_cpu_s": round(connect_cpu, 3),
        "hello_to_welcome_ms": {"p50": 1e3 * pct(server_lat, 50), "p99": 1e3 * pct(server_lat, 99),
                                "max": 1e3 * max(server_lat)},
        "connect_to_welcome_ms": {"p50": 1e3 * pct(device_lat, 50), "p99": 1e3 * pct(device_lat, 99),
                                  "max": 1e3 * max(device_lat)},
        "rss_empty_mib": rss_empty / 2**20, "rss_connected_mib": rss_connected / 2**20,
        "rss_idle_mib": rss_idle / 2**20, "rss_peak_mib": server_peak / 2**20,
        "rss_per_device_kib": (rss_idle - rss_empty) / 1024 / n, "rss_added_mib": (rss_idle - rss_empty) / 2**20,
        "idle_s": round(idle_wall, 2), "idle_cpu_share": idle_cpu / idle_wall,
        "workers_idle_cpu_share": workers_idle_cpu / idle_wall,
        "round_wall_s": statistics.median(r["round_wall_s"] for r in warm),
        "round_server_cpu_s": statistics.median(r["server_cpu_s"] for r in warm),
        "first_round_wall_s": rounds[0]["round_wall_s"], "first_round_server_cpu_s": rounds[0]["server_cpu_s"],
        "reported_per_round": [r["reported"] for r in rounds],
        "bye_s": round(bye_s, 3), "bye_server_s": round(bye_server_s, 3),
        "connect_server_cpu_ms_per_device": 1e3 * connect_cpu / n,
        "idle_cpu_ms_per_device_s": 1e3 * idle_cpu / idle_wall / n,
    }


GROWTH = ("round_wall_s", "round_server_cpu_s", "rss_idle_mib", "rss_added_mib", "idle_cpu_share",
          "connect_server_cpu_s", "bye_server_s")


def growth(results: list[dict]) -> dict[str, dict[str, float]]:
    out = {}
    for a, b in zip(results, results[1:]):
        key = f"{b['devices']}/{a['devices']}"
        ratios = {k: (b[k] / a[k] if a[k] else None) for k in GROWTH}
        ratios["hello_to_welcome_p50"] = b["hello_to_welcome_ms"]["p50"] / a["hello_to_welcome_ms"]["p50"]
        ratios["hello_to_welcome_p99"] = b["hello_to_welcome_ms"]["p99"] / a["hello_to_welcome_ms"]["p99"]
        out[key] = ratios
    return out


def table(results: list[dict], ratios: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="one orchestrator process, lightweight devices on 127.0.0.1 (100 sampled per round, tiny model)")
    cols = ["devices", "connect s", "hello->welcome p50/p99 ms (server)", "connect->welcome p50/p99 ms (device)",
            "RSS MiB (empty / connected / peak)", "KiB per device", "idle CPU (1 core = 1)", "round s",
            "server CPU s / round", "bye s"]
    for c in cols:
        t.add_column(c, justify="right")
    t.caption = ("connect s: until every device had its welcome (arrivals at --rate); bye s: the server's goodbye "
                 "to every device until it stopped serving")
    for r in results:
        h, d = r["hello_to_welcome_ms"], r["connect_to_welcome_ms"]
        t.add_row(f"{r['devices']:,}", f"{r['connect_s']:.1f}", f"{h['p50']:.1f} / {h['p99']:.1f}",
                  f"{d['p50']:.0f} / {d['p99']:.0f}",
                  f"{r['rss_empty_mib']:.0f} / {r['rss_idle_mib']:.0f} / {r['rss_peak_mib']:.0f}",
                  f"{r['rss_per_device_kib']:.1f}", f"{r['idle_cpu_share']:.3f}", f"{r['round_wall_s']:.2f}",
                  f"{r['round_server_cpu_s']:.3f}", f"{r['bye_server_s']:.1f}")
    Console(width=220).print(t)
    if ratios:
        g = Table(title="growth (ratio of the larger fleet's figure to the smaller's)")
        g.add_column("figure")
        for k in ratios:
            g.add_column(k, justify="right")
        for fig in [*GROWTH, "hello_to_welcome_p50", "hello_to_welcome_p99"]:
            g.add_row(fig, *(f"{ratios[k][fig]:.2f}" if ratios[k][fig] is not None else "-" for k in ratios))
        Console(width=220).print(g)


async def drive(args: argparse.Namespace) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory(prefix="edgetrain-scale-") as tmp:
        for n in parse_list(args.sizes, int):
            print(f"{n} devices ...", file=sys.stderr, flush=True)
            results.append(await run_size(n, args, Path(tmp)))
            r = results[-1]
            print(f"  connect {r['connect_s']:.1f} s, round {r['round_wall_s']:.2f} s, idle CPU "
                  f"{r['idle_cpu_share']:.3f}, RSS {r['rss_idle_mib']:.0f} MiB, lost {r['lost']}",
                  file=sys.stderr, flush=True)
    return results


def arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-round", type=int, default=100)
    ap.add_argument("--workers", type=int, default=4, help="worker processes holding the devices")
    ap.add_argument("--idle-s", type=float, default=30.0, help="the at-rest window (covers a heartbeat period)")
    ap.add_argument("--settle-s", type=float, default=3.0)
    ap.add_argument("--rate", type=float, default=100.0,
                    help="devices connecting per second, over the whole fleet (0: all at once)")
    ap.add_argument("--connect-timeout", type=float, default=900.0)
    ap.add_argument("--profile", help="directory for a cProfile of each server process")
    # internal: the orchestrator process and the worker processes
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--work", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--devices", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--profile-file", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--spec-file", help=argparse.SUPPRESS)
    ap.add_argument("--workers-total", type=int, default=1, help=argparse.SUPPRESS)


def run(ctx: Context) -> dict | None:
    args = ctx.args
    if args.serve:
        args.profile = args.profile_file
        serve(args)
        return None
    if args.work:
        work(args)
        return None
    results = asyncio.run(drive(args))
    ratios = growth(results)
    table(results, ratios)
    return ctx.write(results, {"settings": {"model": "tiny", "strategy": "fedavg", "heartbeat": "websockets ping 20 s"},
                               "growth": ratios})


CASE = Case("scale", __doc__, run, arguments=arguments,
            quick={"sizes": "20", "rounds": 1, "per_round": 10, "workers": 1, "idle_s": 2.0, "settle_s": 1.0,
                   "rate": 0.0})


def main(argv: list[str] | None = None) -> dict | None:
    return CASE.main(argv)


if __name__ == "__main__":
    main()
