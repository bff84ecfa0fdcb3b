// A phone on a LAN, made on this machine: a network namespace joined to the test's own by a veth pair
// with private addresses (10.231.k.1 here, 10.231.k.2 there), where `edgetrain serve --web --host 0.0.0.0`
// runs, so that the device page is opened at a non-loopback address as a phone opens it. Needs root
// (`ip netns add`); `lanNamespace()` says why not where it cannot be made.
import { execFileSync } from "node:child_process";
import { createHash, X509Certificate } from "node:crypto";
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";

const ip = (...args) => execFileSync("ip", args, { stdio: ["ignore", "ignore", "pipe"] });

/** A namespace and its veth pair: `{ name, host, server, exec(args), close() }`, or a string: why not. */
export function lanNamespace() {
  if (process.getuid?.() !== 0) return "a network namespace needs root";
  const k = 20 + (process.pid % 200);
  const name = `et-lan-${process.pid}`;
  const [outside, inside] = [`etl${process.pid % 100000}a`, `etl${process.pid % 100000}b`];
  const host = `10.231.${k}.1`;
  const server = `10.231.${k}.2`;
  try {
    ip("netns", "add", name);
    ip("link", "add", outside, "type", "veth", "peer", "name", inside);
    ip("link", "set", inside, "netns", name);
    ip("addr", "add", `${host}/24`, "dev", outside);
    ip("link", "set", outside, "up");
    ip("-n", name, "addr", "add", `${server}/24`, "dev", inside);
    ip("-n", name, "link", "set", inside, "up");
    ip("-n", name, "link", "set", "lo", "up");
    ip("-n", name, "route", "add", "default", "via", host); // the LAN address is the one the default route leaves by
  } catch (exc) {
    try { ip("link", "del", outside); } catch { /* not made */ }
    try { ip("netns", "del", name); } catch { /* not made */ }
    return `cannot make a network namespace here: ${String(exc.stderr ?? exc.message).trim().split("\n")[0]}`;
  }
  return {
    name, host, server,
    /** `command args` run inside the namespace (as `ip netns exec`). */
    wrap: (command, args) => ["ip", ["netns", "exec", name, command, ...args]],
    close: () => {
      try { ip("link", "del", outside); } catch { /* gone with the namespace */ }
      try { ip("netns", "del", name); } catch { /* already gone */ }
    },
  };
}

/**
 * How Chromium trusts the server's local certificate authority, as a phone does once it installed it:
 * an NSS database in the browser's own HOME with the authority as a trusted CA (`certutil`, Debian's
 * libnss3-tools), so the chain is verified by Chromium itself (names, name constraints, usage, dates);
 * where certutil is missing, the authority's key pinned by `--ignore-certificate-errors-spki-list`
 * (which skips that verification). Returns `{ env, args, how }` for the launch.
 */
export function trustAuthority(caPem, home) {
  mkdirSync(home, { recursive: true });
  const certutil = ["/usr/bin/certutil", "/bin/certutil"].find((p) => existsSync(p));
  if (certutil !== undefined) {
    const db = join(home, ".pki", "nssdb");
    mkdirSync(db, { recursive: true });
    execFileSync(certutil, ["-d", `sql:${db}`, "-N", "--empty-password"]);
    execFileSync(certutil, ["-d", `sql:${db}`, "-A", "-t", "C,,", "-n", "edgetrain local CA", "-i", caPem]);
    return { env: { ...process.env, HOME: home }, args: [], how: "NSS database (certutil)" };
  }
  const spki = new X509Certificate(readFileSync(caPem)).publicKey.export({ type: "spki", format: "der" });
  const pin = createHash("sha256").update(spki).digest("base64");
  return { env: { ...process.env, HOME: home }, args: [`--ignore-certificate-errors-spki-list=${pin}`], how: "SPKI pin" };
}

/** Every response a page's loads got, and with `browser` those of service workers that start meanwhile
 * (their precache), from the DevTools protocol: url, status, from the service worker or the network,
 * encoding, and the bytes that came over the network (0 from the service worker or a cache). */
export async function recordNetwork(page, browser = null) {
  const byId = new Map();
  const watch = async (session, where) => {
    session.on("Network.responseReceived", ({ requestId, response }) => {
      byId.set(`${where}/${requestId}`, { url: response.url, status: response.status, where,
        fromServiceWorker: response.fromServiceWorker === true, fromCache: response.fromDiskCache === true,
        encoding: Object.entries(response.headers).find(([k]) => k.toLowerCase() === "content-encoding")?.[1] ?? "",
        bytes: 0 });
    });
    session.on("Network.loadingFinished", ({ requestId, encodedDataLength }) => {
      const r = byId.get(`${where}/${requestId}`);
      if (r !== undefined) r.bytes = r.fromServiceWorker || r.fromCache ? 0 : encodedDataLength;
    });
    await session.send("Network.enable");
  };
  await watch(await page.createCDPSession(), "page");
  const onTarget = async (target) => {
    if (target.type() === "service_worker") await watch(await target.createCDPSession(), "worker").catch(() => {});
  };
  browser?.on("targetcreated", onTarget);
  return { responses: () => [...byId.values()], stop: () => browser?.off("targetcreated", onTarget) };
}
