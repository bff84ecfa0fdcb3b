// The zoo's transformer trains in every JavaScript runtime as in the Python device: the test-sized
// one's weak split (an attention block and the head, after the frozen embedding chunk's int64 input).
// Its every split, the strong one's int64 training input included, runs in the slow tier
// (transformer-splits.test.mjs).
import { conformanceSuite } from "./conformance-suite.mjs";

conformanceSuite(["char_transformer_tiny:2"]);
