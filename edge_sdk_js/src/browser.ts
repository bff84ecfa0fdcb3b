/**
 * The browser entry of the edgetrain device SDK (docs/js-device.md, "A browser page"): everything a
 * page needs, and no Node module. The runtime is the page's own `onnxruntime-web`, given to
 * `makeRuntime`; an update not yet acknowledged is kept in IndexedDB (`indexedDbStore`), and so are the
 * payloads it downloaded (`indexedDbPayloadStore`).
 * `npm run build` also bundles it, with its dependencies, into one ES module
 * (`dist/edgetrain.browser.mjs`), which `edgetrain serve --web` serves to its device page.
 */
export * from "./errors.js";
export * from "./messages.js";
export * from "./tensors.js";
export * from "./transfer.js";
export * from "./session.js";
export * from "./runtime.js";
export * from "./sampling.js";
export * from "./trainer.js";
export * from "./forward.js";
export * from "./credentials.js";
export * from "./transport.js";
export * from "./data.js";
export * from "./phases.js";
export * from "./algorithms/index.js";
export * from "./backends/index.js";
export * from "./client.js";
export * from "./pending.js";
export * from "./payload-store.js";
export * from "./payload-store-idb.js";
export * from "./wire-codecs.js";
export * from "./local-data.js";
export * as codecs from "./codecs/index.js";
export * from "./dp.js";
