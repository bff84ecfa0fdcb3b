// The zoo's transformer trains in every JavaScript runtime as in the Python device: the test-sized
// one's weak split (an attention block and the head, after the frozen embedding chunk's int64
// input) trained through its LoRA adapters (the graph's frozen weights are inputs without deltas).
// Every split trained whole, the strong one's int64 training input included, runs in the slow tier
// (transformer-splits.test.mjs).
import { conformanceSuite } from "./conformance-suite.mjs";

conformanceSuite(["char_transformer_tiny@rank=4:2:adapters"]);
