// Headless Chromium (Debian's `chromium`, driven by puppeteer-core: no browser download) and a
// page served from 127.0.0.1 with the cross-origin isolation headers that give WebAssembly
// threads, loading the built SDK and onnxruntime-web as ES modules from local files.
import { existsSync, readFileSync, statSync } from "node:fs";
import { createServer } from "node:http";
import { basename, extname, join, normalize, resolve } from "node:path";
import { HERE } from "./cases.mjs";

const ROOT = resolve(HERE, "..");
export const CHROMIUM = process.env.CHROMIUM ?? ["/usr/bin/chromium", "/usr/bin/chromium-browser"].find((p) => existsSync(p));
export const CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--no-first-run"];

const TYPES = { ".js": "text/javascript", ".mjs": "text/javascript", ".wasm": "application/wasm", ".html": "text/html",
  ".json": "application/json", ".bin": "application/octet-stream", ".onnx": "application/octet-stream" };

/** The page: an import map for the SDK's dependencies, onnxruntime-web as `window.ort`. */
export const PAGE = `<!doctype html><html><head><meta charset="utf-8"><title>edgetrain device</title>
<script type="importmap">{"imports": {
  "@msgpack/msgpack": "/node_modules/@msgpack/msgpack/dist.esm/index.mjs",
  "@noble/hashes/": "/node_modules/@noble/hashes/"
}}</script>
<script type="module">
  import * as ort from "/node_modules/onnxruntime-web/dist/ort.wasm.min.mjs";
  import * as sdk from "/dist/index.js";
  ort.env.wasm.wasmPaths = "/node_modules/onnxruntime-web/dist/";
  window.ort = ort;
  window.sdk = sdk;
  window.ready = true;
</script></head><body><pre id="log"></pre></body></html>`;

/**
 * Serve the package folder (dist, node_modules, test) and `extra` folders (`/<name>/...`) on
 * 127.0.0.1 with COOP same-origin and COEP require-corp. Resolves `{ url, close }`.
 */
export function servePage(extra = {}) {
  const server = createServer((req, res) => {
    const path = decodeURIComponent(new URL(req.url, "http://x").pathname);
    const headers = { "Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp",
      "Cross-Origin-Resource-Policy": "same-origin", "Cache-Control": "no-store" };
    if (path === "/" || path === "/index.html") {
      res.writeHead(200, { ...headers, "Content-Type": "text/html" }).end(PAGE);
      return;
    }
    const [, top, ...rest] = path.split("/");
    const base = top in extra ? extra[top] : ["dist", "node_modules", "test"].includes(top) ? join(ROOT, top) : null;
    const file = base === null ? null : normalize(join(base, ...rest));
    if (file === null || !file.startsWith(base) || !existsSync(file) || !statSync(file).isFile()) {
      res.writeHead(404, headers).end();
      return;
    }
    res.writeHead(200, { ...headers, "Content-Type": TYPES[extname(file)] ?? "application/octet-stream" }).end(readFileSync(file));
  });
  return new Promise((resolvePage) => server.listen(0, "127.0.0.1", () => {
    resolvePage({ url: `http://127.0.0.1:${server.address().port}/`, close: () => new Promise((r) => server.close(r)) });
  }));
}

/** A headless Chromium with the page open and loaded (window.ready). */
export async function openPage(url) {
  const { default: puppeteer } = await import("puppeteer-core");
  // A device page may train for many minutes inside one evaluate: the callers bound it with their own timeouts.
  const browser = await puppeteer.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_FLAGS, protocolTimeout: 0 });
  const page = await browser.newPage();
  page.on("pageerror", (err) => console.error(`# page error: ${err.message}`));
  await page.goto(url);
  await page.waitForFunction(() => window.ready === true, { timeout: 60_000 });
  return { browser, page };
}

/**
 * Resident memory of the browser's tab renderers (VmRSS and peak VmHWM, bytes), from /proc. Beside
 * the page's renderer there may be a spare one (a fresh renderer, ~80 MiB): the page's is the largest.
 */
export function rendererMemory(browser) {
  const root = browser.process()?.pid;
  const out = [];
  if (root === undefined) return out;
  const children = (pid) => {
    try {
      return readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim().split(/\s+/).filter(Boolean).map(Number);
    } catch { return []; }
  };
  const walk = (pid) => {
    for (const child of children(pid)) {
      try {
        const cmd = readFileSync(`/proc/${child}/cmdline`, "utf8");
        // Tab renderers only: not the browser's own WebUI renderer (its top chrome).
        if (cmd.includes("--type=renderer") && !cmd.includes("--top-chrome-webui")) {
          const status = readFileSync(`/proc/${child}/status`, "utf8");
          const kb = (key) => Number(new RegExp(`${key}:\\s+(\\d+)`).exec(status)?.[1] ?? 0) * 1024;
          out.push({ pid: child, rss: kb("VmRSS"), peak: kb("VmHWM") });
        }
      } catch { /* gone */ }
      walk(child);
    }
  };
  walk(root);
  return out;
}

/** Run one case inside the page (files fetched from /cases/<folder>/). */
export async function conformanceInPage(page, folder) {
  return page.evaluate(async (base) => {
    const { decodeTensors, makeRuntime } = window.sdk;
    const bytes = async (name) => {
      const res = await fetch(`${base}/${name}`);
      if (!res.ok) throw new Error(`${name}: ${res.status}`);
      return new Uint8Array(await res.arrayBuffer());
    };
    const summary = JSON.parse(new TextDecoder().decode(await bytes("expected.json")));
    const chunks = [];
    for (let i = 0; i < summary.chunks; i++) chunks.push(await bytes(`chunk-${i}.onnx`));
    const c = { chunks, graph: await bytes("graph.bin"), state: decodeTensors(await bytes("state.bin")),
      data: decodeTensors(await bytes("data.bin")), plan: decodeTensors(await bytes("plan.bin")),
      expected: decodeTensors(await bytes("expected.bin")), summary };
    const { runConformance } = await import("/test/conformance-core.mjs");
    const result = await runConformance(makeRuntime("onnxruntime-web", window.ort, 1), c);
    return { ...result, isolated: window.crossOriginIsolated,
      expectedNames: Object.keys(c.expected).filter((k) => k.startsWith("delta:")).map((k) => k.slice(6)).sort() };
  }, `/cases/${basename(folder)}`);
}

