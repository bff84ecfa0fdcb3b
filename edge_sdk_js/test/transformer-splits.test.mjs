// Every split of the test-sized transformer in every JavaScript runtime (slow tier): the strong
// device's whole model from token ids (embedding gradients), each attention block, the head.
import { conformanceSuite } from "./conformance-suite.mjs";

conformanceSuite(["char_transformer_tiny:0", "char_transformer_tiny:1", "char_transformer_tiny:2", "char_transformer_tiny:3"]);
