// One device configuration in both SDKs: the package carries the Python declaration's key table
// (src/settings-table.ts from edge_sdk/device_settings.json), and the Node device and the Python
// device read one config file holding every key of it to the same settings (`--print-settings`,
// byte for byte), warn about the keys they do not honour, and refuse the same bad values in the
// same words with the same exit status.
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { SETTINGS_TABLE } from "../dist/settings-table.js";
import { checkSetting, FOREVER, settingDefault } from "../dist/settings.js";
import { pyFloat } from "../dist/pyformat.js";
import { parseSize } from "../dist/units.js";
import { HERE, REPO, python, pythonEnv } from "./cases.mjs";
import { tempDir } from "./fleet.mjs";

const CLI = join(HERE, "..", "dist", "cli.js");

/** The Node device's command line, run to its end. */
function node(...args) {
  const out = spawnSync(process.execPath, [CLI, ...args], { encoding: "utf8", timeout: 60_000 });
  return { status: out.status, stdout: out.stdout, stderr: out.stderr };
}

/** The Python device's command (edge_sdk.cli.main) on each command line, in one Python process. */
function pythonDevice(...argvs) {
  const out = execFileSync(python(), [join(HERE, "device_cli.py")], { input: JSON.stringify(argvs), env: pythonEnv(), cwd: REPO,
    encoding: "utf8", timeout: 120_000 });
  return JSON.parse(out);
}

/** Every key of the table, each with a value other than its default, as a board's file would give it. */
const EVERY_KEY = `# every documented key (docs/device-guide.md, "Options")
server = "wss://fl.example.org:8765"
id = "board-7"
budget = "300MiB"
backend = "onnxruntime"
data = "/var/lib/edgetrain/samples.csv"
label_column = "label"            # an underscore works too
image-size = "32x32"
vocabulary = "tinyshakespeare"
text-context = 64
text-stride = 4
image-mode = "L"
flatten = true
data-root = "/data"
data-limit = 100
partition = "dirichlet:0.5"
client = 2
num-clients = 4
seed = 7
bundle = "board.tar"
secret-file = "/etc/edgetrain/board-7.secret"
token = "lab-token"
secure-min-survivors = 4
tls-ca = "ca.pem"
threads = 2
cores = 4
storage = "disk"
work-dir = "/tmp/work"
label = [
  "site=lab",
  "priority=1",
]
private-heat = 1e-05
table-rows = ["0=611"]
registry = "my_app.phases:REGISTRY"
log-format = "json"
log-file = "/var/log/edgetrain/device.log"
log-level = "debug"
json-events = true
reconnect-retries = -1
reconnect-max-delay = 60
once = true
debug = false
device-class = "pi-zero-2w"
runtime = "web"
pending = "/var/lib/edgetrain/pending.bin"
payload-cache = "/var/lib/edgetrain/held"
payload-cache-size = "64MiB"
`;

test("settings: the package's key table is the Python declaration's, and the build checks it", () => {
  const declared = JSON.parse(readFileSync(join(REPO, "edge_sdk", "device_settings.json"), "utf8"));
  assert.deepEqual(SETTINGS_TABLE, declared);
  const check = spawnSync(process.execPath, [join(HERE, "..", "scripts", "settings-table.mjs"), "--check"], { encoding: "utf8" });
  assert.equal(check.status, 0, check.stderr);
  // One reconnect policy: a device is a service that retries forever, backing off to 30 s.
  assert.equal(settingDefault("reconnect-retries"), FOREVER);
  assert.equal(settingDefault("reconnect-max-delay"), 30);
});

test("settings: both devices print the same settings from one file holding every key", () => {
  const dir = tempDir("edgetrain-js-settings-");
  const file = join(dir, "device.toml");
  writeFileSync(file, EVERY_KEY);
  const written = new Set([...EVERY_KEY.matchAll(/^([a-z_-]+) =/gm)].map((m) => m[1].replaceAll("_", "-")));
  assert.deepEqual([...written].sort(), SETTINGS_TABLE.settings.map((r) => r.key).sort(), "the file holds every key of the table");

  const [py, pyOverridden] = pythonDevice(["--config", file, "--print-settings"],
    ["--config", file, "--threads", "3", "--reconnect-retries", "5", "--label", "a=1", "--print-settings"]);
  const js = node("--config", file, "--print-settings");
  assert.equal(py.status, 0, py.stderr);
  assert.equal(js.status, 0, js.stderr);
  assert.equal(js.stdout, py.stdout, "the same settings, printed the same");
  const printed = JSON.parse(js.stdout);
  assert.deepEqual(Object.keys(printed), SETTINGS_TABLE.settings.map((r) => r.key));
  assert.equal(printed["reconnect-retries"], -1);
  assert.equal(printed["budget"], 300 * 2 ** 20);
  assert.deepEqual(printed["label"], ["site=lab", "priority=1"]);
  assert.match(js.stdout, /"reconnect-max-delay": 60\.0,/);
  assert.match(js.stdout, /"private-heat": 1e-05,/);

  // Each device warns about the keys only the other honours, naming the key and the device.
  for (const [out, sdk, other] of [[js, "javascript", "python"], [py, "python", "javascript"]]) {
    const warned = [...out.stderr.matchAll(/^warning: .*device\.toml: ([a-z_-]+): a setting of the (\w+) device only; this device ignores it$/gm)];
    const foreign = SETTINGS_TABLE.settings.filter((r) => !r.sdks.includes(sdk)).map((r) => r.key);
    assert.deepEqual(warned.map((m) => m[1].replaceAll("_", "-")).sort(), foreign.sort(), `${sdk} warns about ${foreign}`);
    assert.ok(warned.every((m) => m[2] === other));
  }

  // The command line wins over the file, in both.
  const jsOverridden = node("--config", file, "--threads", "3", "--reconnect-retries", "5", "--label", "a=1", "--print-settings");
  assert.equal(jsOverridden.stdout, pyOverridden.stdout);
  assert.equal(JSON.parse(jsOverridden.stdout)["threads"], 3);
  assert.deepEqual(JSON.parse(jsOverridden.stdout)["label"], ["a=1"]);
});

test("settings: a bad value is refused by both devices in the same words, with status 2", () => {
  const dir = tempDir("edgetrain-js-settings-");
  const cases = {
    budget: 'id = "d"\nbudget = "plenty"\n', zero: 'id = "d"\nthreads = 0\n', float: 'id = "d"\nthreads = 3.0\n',
    url: 'id = "d"\nserver = "localhost:8765"\n', unknown: 'id = "d"\nbakcend = "torch"\n', noid: "threads = 2\n",
    tls: 'id = "d"\ntls-ca = "ca.pem"\n', delay: 'id = "d"\nreconnect-max-delay = 0.05\n', retries: 'id = "d"\nreconnect-retries = -2\n',
    choice: 'id = "d"\nstorage = "cloud"\n', list: 'id = "d"\nlabel = [3]\n', bool: 'id = "d"\nonce = "maybe"\n',
    toml: "id = d\n", path: 'id = "a/../b"\n', bidi: 'id = "evil\\u202Etxt"\n', nul: 'id = "bad\\u0000id"\n',
  };
  const files = Object.fromEntries(Object.entries(cases).map(([name, text]) => {
    const file = join(dir, `${name}.toml`);
    writeFileSync(file, text);
    return [name, file];
  }));
  const argvs = [...Object.values(files).map((f) => ["--config", f, "--print-settings"]),
    ["--id", "d", "--budget", "0", "--print-settings"], ["--config", join(dir, "missing.toml"), "--print-settings"]];
  const py = pythonDevice(...argvs);
  argvs.forEach((argv, i) => {
    const js = node(...argv);
    const error = (out) => out.stderr.split("\n").filter((l) => l.startsWith("error: "));
    assert.equal(py[i].status, 2, `${argv}: ${py[i].stderr}`);
    assert.equal(js.status, 2, `${argv}: ${js.stderr}`);
    assert.equal(js.stdout, "");
    assert.equal(error(js).length, 1, js.stderr);
    assert.deepEqual(error(js), error(py[i]), `${argv}: the same words`);
  });
});

test("settings: values as the Python converter reads them", () => {
  assert.equal(checkSetting("budget", "1.5GiB"), 1.5 * 2 ** 30);
  assert.equal(checkSetting("budget", 4096n), 4096);
  assert.equal(checkSetting("budget", "none"), null);
  assert.equal(checkSetting("reconnect-max-delay", 2n), 2);
  assert.equal(checkSetting("label-column", 3n), "3");
  assert.deepEqual(checkSetting("label", "priority=1"), ["priority=1"]);
  assert.equal(checkSetting("once", "yes"), true);
  assert.throws(() => checkSetting("threads", 2.0, "device.toml: threads"), /^SettingError: device\.toml: threads: must be an integer \(a whole number\) >= 1, got 2\.0$/);
  assert.equal(parseSize("300MB"), 300e6);
  assert.equal(parseSize("2.5"), 2); // halves to even, as Python's round
  for (const [x, repr] of [[30, "30.0"], [0.1, "0.1"], [1e-5, "1e-05"], [1.5e16, "1.5e+16"], [1e16, "1e+16"], [123456789.5, "123456789.5"],
    [-0.0001, "-0.0001"], [2 ** 53, "9007199254740992.0"], [1 / 3, "0.3333333333333333"]]) {
    assert.equal(pyFloat(x), repr);
  }
});
