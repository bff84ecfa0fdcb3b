// The heavy tier's budgets tests (`make test-heavy`, not CI): a tab training on its GPU (WebGPU; SwiftShader
// here) at a weak budget (530 MiB) and a moderate one (710 MiB), planned weak and moderate, its renderer under
// the budget for three rounds, its GPU process reported (test/budgets.mjs, gpuTabTest). The planner charges a
// digits_mlp tab on its GPU what its renderer holds while it trains there and the same parameter copies
// (profiles/runtime.py, WEBGPU_RUNTIME_BYTES): weak from 526 MiB, moderate from 706 MiB. Minutes of SwiftShader
// a round on a 2-core machine; in CI the buffered fleet (test/buffered-fleet.test.mjs) runs a tab on its GPU at
// 710 MiB, planned moderate, its renderer's peak under the budget.
import { gpuTabTest } from "./budgets.mjs";

gpuTabTest(530, "weak");
gpuTabTest(710, "moderate");
