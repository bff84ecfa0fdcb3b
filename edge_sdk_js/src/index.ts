/** The edgetrain device SDK for JavaScript (docs/js-device.md): the Node entry, the browser entry's
 * API (src/browser.ts) and `loadRuntime`, which imports an ONNX Runtime package by name. */
export * from "./browser.js";
export { loadRuntime } from "./load-runtime.js";
