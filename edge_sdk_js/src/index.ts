/** The edgetrain device SDK for JavaScript (docs/js-device.md). */
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
export * from "./client.js";
export * from "./pending.js";
export * from "./dp.js";
