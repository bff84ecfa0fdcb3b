// The package as `npm pack` makes it (docs/js-device.md, "The package"): what the tarball holds, its
// entries by condition, a browser entry (and its one-file bundle) that imports no Node module and
// neither onnxruntime-node nor ws, and a command whose static imports hold none of the optional peer
// dependencies (onnxruntime-web, onnxruntime-node, ws: a page installs the first, a board the others),
// so that `--help` runs in either install. test/package-install.test.mjs installs the tarball.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { builtinModules } from "node:module";
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { HERE } from "./cases.mjs";
import { tempDir } from "./fleet.mjs";

const ROOT = resolve(HERE, "..");
const NODE_ONLY = new Set([...builtinModules, ...builtinModules.map((m) => `node:${m}`), "onnxruntime-node", "ws"]);
const SPECIFIER = /(?:\bimport\s*\(\s*|\bfrom\s*|^\s*import\s*|\bexport\s*\*\s*from\s*|\brequire\s*\(\s*)["']([^"']+)["']/gm;

const STATIC = /(?:\bfrom\s*|^\s*import\s*|\bexport\s*\*\s*from\s*)["']([^"']+)["']/gm;

/** Every module specifier `file` and the package's own modules it reaches import (static and dynamic; `pattern`
 * STATIC: what loads with it, before any of its code runs). */
function importsOf(file, seen = new Set(), pattern = SPECIFIER) {
  if (seen.has(file)) return [];
  seen.add(file);
  const found = [];
  for (const [, spec] of readFileSync(file, "utf8").matchAll(pattern)) {
    if (spec.startsWith(".")) found.push(...importsOf(resolve(dirname(file), spec), seen, pattern));
    else found.push(spec);
  }
  return found;
}

test("npm pack: the files, the entries by condition, a browser entry without Node modules", async () => {
  const dir = tempDir("edgetrain-pack-");
  const [packed] = JSON.parse(execFileSync("npm", ["pack", "--json", "--ignore-scripts", "--pack-destination", dir],
    { cwd: ROOT, encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }));
  const files = execFileSync("tar", ["-tzf", join(dir, packed.filename)], { encoding: "utf8" }).trim().split("\n")
    .map((f) => f.replace(/^package\//, ""));
  for (const need of ["package.json", "README.md", "dist/index.js", "dist/index.d.ts", "dist/browser.js",
    "dist/browser.d.ts", "dist/edgetrain.browser.mjs", "dist/cli.js", "dist/load-runtime.js", "src/client.ts"]) {
    assert.ok(files.includes(need), `the package holds ${need}`);
  }
  assert.deepEqual(files.filter((f) => /^(test|bench|node_modules)\//.test(f) || f === "package-lock.json"), []);

  const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8"));
  for (const name of ["onnxruntime-web", "onnxruntime-node", "ws"]) {
    assert.equal(pkg.dependencies[name], undefined, `${name} is not installed with the package`);
    assert.equal(pkg.peerDependenciesMeta[name]?.optional, true, `${name} is an optional peer`);
  }
  const cli = importsOf(join(ROOT, "dist", "cli.js"), new Set(), STATIC);
  assert.deepEqual(cli.filter((s) => s in pkg.peerDependencies), [], "the command loads its optional peers only when it runs a device");
  const dot = pkg.exports["."];
  for (const target of [dot.browser.default, dot.browser.types, dot.node.default, dot.node.types, pkg.exports["./bundle"], pkg.bin["edgetrain-device"]]) {
    assert.ok(files.includes(target.replace(/^\.\//, "")), `${target} is in the package`);
  }
  assert.equal(dot.browser.default, "./dist/browser.js");

  const browser = importsOf(join(ROOT, "dist", "browser.js"));
  assert.deepEqual(browser.filter((s) => NODE_ONLY.has(s) || s.startsWith("node:")), [], "the browser entry's imports");
  assert.deepEqual(importsOf(join(ROOT, "dist", "edgetrain.browser.mjs")), [], "the bundle is one module");
  const { loadRuntime } = await import(join(ROOT, "dist", "index.js"));
  assert.equal((await loadRuntime("node")).name, "onnxruntime-node", "the Node entry loads onnxruntime-node (loadRuntime)");
  console.log(`# npm pack: ${packed.filename}, ${packed.size} bytes, ${files.length} files; bundle `
    + `${readFileSync(join(ROOT, "dist", "edgetrain.browser.mjs")).length} bytes`);
});

test("the bundle loads on its own and holds the browser API", async () => {
  const sdk = await import(join(ROOT, "dist", "edgetrain.browser.mjs"));
  for (const name of ["DeviceClient", "makeRuntime", "indexedDbStore", "decodeTensors", "makeProof", "csvData", "imageData"]) {
    assert.equal(typeof sdk[name], "function", name);
  }
  assert.equal(sdk.loadRuntime, undefined, "loadRuntime (Node) is not in the browser build");
});
