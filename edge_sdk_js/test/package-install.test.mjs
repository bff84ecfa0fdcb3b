// The package installs as its README says (docs/js-device.md, "The package"): `npm pack`, then each
// install command of the README run in an empty folder with the tarball in the package's place, offline
// from npm's cache (filled first from the registry alone where it lacks a package: every request is to
// the registry) and, where a network namespace can be made (`unshare -rn`), with no network at all, so
// an install script that downloads anything fails the install. Install scripts run as npm runs them for
// a user. Then: the page carries no onnxruntime-node and no ws, the board no onnxruntime-web and no CUDA
// provider; `npx edgetrain-device --help` prints the help in each; a device run in the page's install
// says in one line what to install; the board's loads onnxruntime-node. And, as a control, the board's
// command without `ONNXRUNTIME_NODE_INSTALL=skip` fails without a network (its script downloads). In
// `make test-slow`.
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { test } from "node:test";
import { HERE } from "./cases.mjs";
import { tempDir } from "./fleet.mjs";

const ROOT = resolve(HERE, "..");
const MB = 1e6;
/** Whether commands can run without any network here (a user namespace with its own, empty, network). */
const ISOLATED = spawnSync("unshare", ["-rn", "true"]).status === 0;
const REGISTRY = execFileSync("npm", ["config", "get", "registry"], { encoding: "utf8" }).trim().replace(/\/?$/, "/");

/** The README's install commands: `{ env, packages, what }` from lines `[VAR=value ]npm install PACKAGES  # what`. */
function readmeInstalls() {
  const text = readFileSync(join(ROOT, "README.md"), "utf8");
  const block = /```sh\n([\s\S]*?)```/.exec(text)[1];
  return block.trim().split("\n").map((line) => {
    const m = /^((?:[A-Z_]+=\S+ )*)npm install ([^#]+?)\s*#\s*(.+)$/.exec(line);
    assert.ok(m, `an install line of the README: ${line}`);
    const env = Object.fromEntries(m[1].trim().split(/\s+/).filter(Boolean).map((kv) => kv.split("=")));
    return { env, packages: m[2].split(/\s+/), what: m[3] };
  });
}

// npm at its own log level, whatever ran the tests: `npm run -s` passes npm_config_loglevel=silent to its
// children, and a silent npm does not name the package whose install script failed.
const { npm_config_loglevel: _loglevel, ...INHERITED } = process.env;

function npm(args, { cwd, env = {}, isolated = false }) {
  const argv = isolated && ISOLATED ? ["unshare", ["-rn", "npm", ...args]] : ["npm", args];
  return spawnSync(argv[0], argv[1], { cwd, encoding: "utf8", env: { ...INHERITED, ...env }, timeout: 600_000 });
}

/** An empty app folder. */
function emptyApp(name) {
  const dir = tempDir(`edgetrain-install-${name}-`);
  writeFileSync(join(dir, "package.json"), JSON.stringify({ name: `app-${name}`, private: true }));
  return dir;
}

/**
 * `npm install` of `packages` into an empty folder, offline and without a network. Where npm's cache lacks
 * a package, it is filled first by the same install elsewhere, from the registry, scripts off: every
 * request of that install is to the registry (`requests` lists them).
 */
function install(name, packages, env) {
  const args = ["install", ...packages, "--no-audit", "--no-fund", "--foreground-scripts"];
  let dir = emptyApp(name);
  let out = npm([...args, "--offline"], { cwd: dir, env, isolated: true });
  const requests = [];
  if (out.status !== 0 && /ENOTCACHED/.test(out.stderr)) {
    const fill = npm(["install", ...packages, "--no-audit", "--no-fund", "--prefer-offline", "--ignore-scripts", "--loglevel", "http"],
      { cwd: emptyApp(`${name}-cache`) });
    assert.equal(fill.status, 0, fill.stderr);
    requests.push(...[...fill.stderr.matchAll(/http fetch \w+ \d+ (\S+)/g)].map((m) => m[1]));
    dir = emptyApp(name);
    out = npm([...args, "--offline"], { cwd: dir, env, isolated: true });
  }
  return { dir, out, requests };
}

function sizeOf(path) {
  const s = statSync(path);
  return s.isDirectory() ? readdirSync(path).reduce((a, f) => a + sizeOf(join(path, f)), 0) : s.size;
}

function npx(dir, args) {
  return spawnSync("npx", ["--offline", "edgetrain-device", ...args], { cwd: dir, encoding: "utf8", timeout: 60_000 });
}

test("npm pack, then the README's installs for a page and for a board: offline, from the registry's packages alone",
  { timeout: 1_200_000 }, () => {
    const packDir = tempDir("edgetrain-pack-");
    const [packed] = JSON.parse(execFileSync("npm", ["pack", "--json", "--ignore-scripts", "--pack-destination", packDir],
      { cwd: ROOT, encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }));
    const tarball = join(packDir, packed.filename);
    const installs = readmeInstalls();
    const [page, board] = ["a page", "a board"].map((what) => installs.find((i) => i.what === what));
    assert.ok(page && board, "the README gives an install for a page and one for a board");
    if (!ISOLATED) console.log("# no network namespace here: the installs run --offline with the network up");
    const withTarball = (i) => i.packages.map((p) => (p === "edgetrain-device" ? tarball : p));

    for (const i of installs) {
      const { dir, out, requests } = install(i.what.replace(/\W+/g, "-"), withTarball(i), i.env);
      assert.equal(out.status, 0, `${i.what}: ${out.stderr.slice(-2000)}`);
      assert.deepEqual(requests.filter((u) => !u.startsWith(REGISTRY)), [], "every download is from the registry");
      const modules = join(dir, "node_modules");
      const has = (name) => existsSync(join(modules, name, "package.json"));
      for (const name of ["onnxruntime-web", "onnxruntime-node", "ws"]) {
        assert.equal(has(name), i.packages.some((p) => p.split("@")[0] === name), `${i.what}: ${name} installed only if named`);
      }
      if (has("onnxruntime-node")) {
        const providers = execFileSync("find", [join(modules, "onnxruntime-node"), "-name", "*providers_cuda*"], { encoding: "utf8" });
        assert.equal(providers.trim(), "", "no CUDA provider was downloaded");
      }
      const help = npx(dir, ["--help"]);
      assert.equal(help.status, 0, `${i.what}: npx edgetrain-device --help: ${help.stderr}`);
      assert.match(help.stdout, /^usage: edgetrain-device /);
      console.log(`# ${i.what}: ${(sizeOf(modules) / MB).toFixed(0)} MB installed`
        + `${has("onnxruntime-web") ? `, onnxruntime-web ${(sizeOf(join(modules, "onnxruntime-web")) / MB).toFixed(0)} MB` : ""}`
        + `${has("onnxruntime-node") ? `, onnxruntime-node ${(sizeOf(join(modules, "onnxruntime-node")) / MB).toFixed(0)} MB` : ""}`
        + `; ${requests.length} requests to the registry to fill npm's cache`);
      if (i === page) {
        writeFileSync(join(dir, "d.csv"), "a,label\n1,0\n2,1\n");
        const run = npx(dir, ["--id", "p-1", "--server", "ws://127.0.0.1:9", "--data", "d.csv", "--budget", "300MiB"]);
        assert.equal(run.status, 1, run.stderr);
        assert.deepEqual(run.stderr.trim().split("\n"), ["error: this device needs ws and onnxruntime-node, installed beside "
          + "edgetrain-device: ONNXRUNTIME_NODE_INSTALL=skip npm install ws onnxruntime-node@1.30 (or --runtime web: npm install ws)"]);
      }
      if (i === board) {
        const loaded = spawnSync(process.execPath, ["--input-type=module", "-e",
          "const { loadRuntime } = await import('edgetrain-device'); console.log((await loadRuntime('node')).name)"],
        { cwd: dir, encoding: "utf8" });
        assert.equal(loaded.stdout.trim(), "onnxruntime-node", loaded.stderr);
      }
    }

    // The control: the board's command without the variable runs onnxruntime-node's download, which fails with no network.
    if (ISOLATED && process.platform === "linux" && process.arch === "x64") {
      const { out } = install("board-downloading", withTarball(board), { ONNXRUNTIME_NODE_INSTALL: "" });
      assert.notEqual(out.status, 0, "without ONNXRUNTIME_NODE_INSTALL=skip onnxruntime-node's script downloads");
      assert.match(out.stderr + out.stdout, /onnxruntime-node[\s\S]*script\/install/);
    }
  });
