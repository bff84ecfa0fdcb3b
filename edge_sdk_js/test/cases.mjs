// Reference cases from the Python device (test/reference.py), generated once per set of cases
// into a cache folder keyed by the script's content.
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, renameSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { decodeTensors } from "../dist/index.js";

export const HERE = dirname(fileURLToPath(import.meta.url));
export const REPO = resolve(HERE, "..", "..");

/** The Python that runs the project: $EDGETRAIN_PYTHON, the repository's .venv, or python3. */
export function python() {
  if (process.env.EDGETRAIN_PYTHON) return process.env.EDGETRAIN_PYTHON;
  const venv = join(REPO, ".venv", "bin", "python");
  return existsSync(venv) ? venv : "python3";
}

export function pythonEnv() {
  return { ...process.env, PYTHONPATH: [REPO, process.env.PYTHONPATH].filter(Boolean).join(":") };
}

/**
 * Folders of the cases `model:split`, exported and run by the Python device when not cached;
 * `options`: reference.py's (`["--samples", "32", "--steps", "2"]`: smaller cases).
 */
export function referenceCases(cases, options = []) {
  const script = join(HERE, "reference.py");
  const key = createHash("sha256").update(readFileSync(script)).update([...cases, ...options].join(",")).digest("hex").slice(0, 16);
  const out = join(process.env.EDGETRAIN_JS_CASES ?? tmpdir(), `edgetrain-js-cases-${key}`);
  const folders = cases.map((c) => join(out, c.replaceAll(":", "-")));
  if (!folders.every((f) => existsSync(join(f, "expected.json")))) {
    // Written aside and moved into place: test files running at the same time never read half a case.
    const staging = mkdtempSync(`${out}.staging-`);
    execFileSync(python(), [script, "--out", staging, ...options, ...cases], { env: pythonEnv(), stdio: ["ignore", "ignore", "inherit"] });
    if (existsSync(out) && !folders.every((f) => existsSync(join(f, "expected.json")))) rmSync(out, { recursive: true, force: true });
    try {
      renameSync(staging, out);
    } catch {
      rmSync(staging, { recursive: true, force: true }); // another run moved its copy first
    }
  }
  return folders;
}

export function loadCase(folder) {
  const read = (name) => new Uint8Array(readFileSync(join(folder, name)));
  const chunks = [];
  for (let i = 0; existsSync(join(folder, `chunk-${i}.onnx`)); i++) chunks.push(read(`chunk-${i}.onnx`));
  return {
    chunks,
    graph: read("graph.bin"),
    state: decodeTensors(read("state.bin")),
    data: decodeTensors(read("data.bin")),
    plan: decodeTensors(read("plan.bin")),
    expected: decodeTensors(read("expected.bin")),
    summary: JSON.parse(readFileSync(join(folder, "expected.json"), "utf8")),
  };
}

/** max |a - b| / max(|b|), the worst entry relative to the reference tensor's largest magnitude. */
export function relError(a, b) {
  let worst = 0, scale = 0;
  for (let i = 0; i < b.length; i++) {
    worst = Math.max(worst, Math.abs(Number(a[i]) - Number(b[i])));
    scale = Math.max(scale, Math.abs(Number(b[i])));
  }
  return scale === 0 ? worst : worst / scale;
}
