/** What can go wrong on the wire, as the stable codes of docs/protocol.md, "Errors". */

export const ErrorCode = {
  MALFORMED: "malformed",
  UNKNOWN_TYPE: "unknown_type",
  BAD_VERSION: "bad_version",
  TOO_LARGE: "too_large",
  BAD_DTYPE: "bad_dtype",
  BAD_SHAPE: "bad_shape",
  NON_FINITE: "non_finite",
  OUT_OF_ORDER: "out_of_order",
  CHECKSUM: "checksum",
  UNEXPECTED: "unexpected",
  UNAUTHORIZED: "unauthorized",
  REFUSED: "refused",
  TIMEOUT: "timeout",
} as const;

/**
 * A message or transfer broke the protocol. Every check in this SDK raises this and nothing
 * else, so the device can answer with an `error` frame carrying `code` and close.
 * `remote` is true when the peer reported it in an `error` message.
 */
export class ProtocolError extends Error {
  readonly code: string;
  readonly remote: boolean;

  constructor(code: string, message: string, remote = false) {
    super(`${code}: ${message}`);
    this.name = "ProtocolError";
    this.code = code;
    this.remote = remote;
  }
}

/** The server turned the device away (bad credentials, budget too small): retrying will not help. */
export class DeviceRefused extends Error {
  constructor(message: string) {
    super(message);
    this.name = "DeviceRefused";
  }
}

/** The server closed the round the device was working on. */
export class RoundAborted extends Error {
  constructor(message: string) {
    super(message);
    this.name = "RoundAborted";
  }
}

/** A setting, option, config file or data source that does not work (the command exits with 2): retrying will not help. */
export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "UsageError";
  }
}

/**
 * A setting's value that cannot be used: `name` is how the user named it (`--budget`,
 * `device.toml: budget`), `problem` what is wrong with it, in the Python device's words
 * (edge_sdk.values.SettingError).
 */
export class SettingError extends UsageError {
  constructor(readonly setting: string, readonly problem: string) {
    super(`${setting}: ${problem}`);
    this.name = "SettingError";
  }
}

/**
 * Optional peer dependencies (package.json) that a command needs and this install lacks: a page's
 * install carries neither `ws` nor `onnxruntime-node`. `message` is one line saying what to install.
 */
export class MissingPackages extends Error {
  constructor(readonly packages: readonly string[], message: string) {
    super(message);
    this.name = "MissingPackages";
  }
}
