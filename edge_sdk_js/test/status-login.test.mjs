// The status page's credential login in a real browser over https (test/status-login.mjs): `--tls-cert`, the
// self-signed certificate of tests/data, which the browser trusts by its key's hash; the device at wss://. A
// wrong credential shows the server's refusal and no status, the right one the status with the devices that
// joined, the page sending proofs only. The same over plain http is the heavy tier's
// (test/status-login-http.test.mjs): the login is the same, and this run holds it over TLS as well.
import { test } from "node:test";
import { SKIP, loginFlow } from "./status-login.mjs";

test("the status page logs in over https (--tls-cert) with an enrolled device's credential, the device at wss://; a wrong one shows an error",
  { timeout: 240_000, skip: SKIP }, () => loginFlow(true));
