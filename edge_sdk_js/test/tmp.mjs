// Temporary folders of the tests (a fleet's server store, its devices' payload folders and logs: about
// 1.5 GB for a mixed fleet), kept as pytest keeps its tmp_path: a passing test's folders are removed when
// it ends, a failing test's are kept and their paths printed, for its logs.
//
// Under node's test runner the hooks are the root test's, so this module is loaded before any test runs:
// test/run.mjs preloads it in every test file's process (`node --test --import ./test/tmp.mjs`), and a file
// that imports it (or fleet.mjs) at its top registers them the same way when run alone. A folder belongs to
// the top-level test that was running when it was made (tests of a file run one after another); one made
// outside a test (at a file's top, in a `before` hook) is removed after the file's last test when no test
// of the file failed.
import { after, afterEach, beforeEach } from "node:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

let depth = 0; // how deep the running test is: 0 outside tests, 1 in a top-level test
let made = []; // folders made by the running top-level test
let outside = []; // folders made outside any test
let failed = false;
/** EDGETRAIN_KEEP_TEST_DIRS=1 keeps every folder, a passing test's too (to read a fleet's logs). */
const KEEP = Boolean(process.env.EDGETRAIN_KEEP_TEST_DIRS);

/** A fresh folder `<system temp>/<prefix>XXXXXX`: removed when the test that made it passes, kept when it fails. */
export function tempDir(prefix) {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  (depth > 0 ? made : outside).push(dir);
  return dir;
}

function remove(dirs) {
  for (const dir of dirs) {
    // A child process the test killed may still be closing its files: rm retries ENOTEMPTY and EBUSY.
    try {
      rmSync(dir, { recursive: true, force: true, maxRetries: 5, retryDelay: 200 });
    } catch (e) {
      console.error(`could not remove ${dir}: ${e.message}`);
    }
  }
}

function keep(dirs, why) {
  for (const dir of dirs) console.error(`kept ${dir} (${why})`);
}

// Only under node's test runner (`node --test`, which marks each file's process with NODE_TEST_CONTEXT): a
// benchmark that imports fleet.mjs keeps its folders, and registering a hook would print an empty TAP report.
if (process.env.NODE_TEST_CONTEXT !== undefined) {
  beforeEach(() => { depth += 1; });
  afterEach(judge);
  after(atEnd);
}

function judge(t) {
  depth -= 1;
  if (!t.passed) failed = true;
  if (depth > 0) return; // a subtest: its folders are its top-level test's, judged when that one ends
  const dirs = made;
  made = [];
  if (!t.passed) keep(dirs, `${t.name} failed`);
  else if (KEEP) keep(dirs, "EDGETRAIN_KEEP_TEST_DIRS");
  else remove(dirs);
}

function atEnd() {
  const dirs = outside;
  outside = [];
  if (failed) keep(dirs, "a test of this file failed");
  else if (KEEP) keep(dirs, "EDGETRAIN_KEEP_TEST_DIRS");
  else remove(dirs);
}
