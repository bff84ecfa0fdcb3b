// The heavy tier's budgets test (`make test-heavy`, not CI): a tab training on its GPU (WebGPU; SwiftShader
// here) at a moderate budget, 710 MiB, planned moderate, its renderer under the budget for three rounds, its
// GPU process reported (test/budgets.mjs, gpuTabTest). Minutes of SwiftShader a round on a 2-core machine;
// in CI the weak GPU tab (test/budgets.test.mjs) holds the same planner figure (WEBGPU_RUNTIME_BYTES) to its
// budget, and the buffered fleet (test/buffered-fleet.test.mjs) runs this very tab, at 710 MiB on its GPU,
// planned moderate and its renderer's peak under the budget.
import { gpuTabTest } from "./budgets.mjs";

gpuTabTest(710, "moderate");
