// The Node device (dist/cli.js, its arguments as given) that also appends, for a test, each block it
// encodes in a secure round to the JSON lines file $EDGETRAIN_TEST_ENCODINGS (test/encodings.mjs):
// the attack test's Node device process. The device itself is the command's, unchanged.
import { appendFileSync } from "node:fs";
import { BlockEncoder } from "../dist/secagg/fixedpoint.js";
import { DeviceRound } from "../dist/secagg/round.js";
import { recordEncodings } from "./encodings.mjs";

const out = process.env.EDGETRAIN_TEST_ENCODINGS;
if (!out) throw new Error("EDGETRAIN_TEST_ENCODINGS names the file the encodings go to");
recordEncodings(BlockEncoder, DeviceRound, (record) => appendFileSync(out, `${JSON.stringify(record)}\n`));
await import("../dist/cli.js");
