// The heavy tier's status page login (`make test-heavy`, not CI; test/status-login.mjs): the same flow as CI's
// test/status-login.test.mjs over plain http, the device at ws://.
import { test } from "node:test";
import { SKIP, loginFlow } from "./status-login.mjs";

test("the status page logs in with an enrolled device's credential; a wrong one shows an error", { timeout: 240_000, skip: SKIP },
  () => loginFlow(false));
