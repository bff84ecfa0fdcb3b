/**
 * The systemd unit that runs a Node device as a service on a board (the Python twin is
 * edge_sdk/systemd.py, `python -m edge_sdk install-service`, and writes the same unit but for its
 * command): `edgetrain-device install-service --config /etc/edgetrain/device.toml --user edgetrain`.
 * The device starts at boot once the network is up, restarts when it fails, and runs as an
 * unprivileged user with a read-only view of the system (its state and logs go to
 * /var/lib/edgetrain and /var/log/edgetrain, temporary files to a private /tmp). A wrong config
 * file or a server that refused the device (exit statuses 2 and 3) is not restarted: that needs a person.
 * Node only.
 */
import { existsSync, renameSync, statSync, writeFileSync } from "node:fs";
import { basename, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

export interface UnitOptions {
  user?: string;
  /** The Node.js that runs the device (default: this one). */
  node?: string;
  /** The device's command line script (default: this package's dist/cli.js). */
  cli?: string;
}

/** The unit file's text for a device run with `config` as `user`; an Error for root or a name that is not one. */
export function serviceUnit(config: string, options: UnitOptions = {}): string {
  const user = options.user ?? "edgetrain";
  if (user === "root" || user === "0") throw new Error("a device runs as an unprivileged user, not root");
  if (user === "" || /\s/.test(user)) throw new Error(`not a user name: ${JSON.stringify(user)}`);
  const node = resolve(options.node ?? process.execPath);
  const cli = resolve(options.cli ?? fileURLToPath(new URL("./cli.js", import.meta.url)));
  return `[Unit]
# Written by edgetrain-device install-service; see docs/js-device.md of edgetrain.
Description=edgetrain device (Node.js): on-device federated training
Wants=network-online.target
After=network-online.target

[Service]
Type=simple
User=${user}
ExecStart=${node} ${cli} --config ${resolve(config)}
Restart=on-failure
RestartSec=10
# 2: a bad option, config file or data source; 3: the server refused the device. Fix, then restart.
RestartPreventExitStatus=2 3
StateDirectory=edgetrain
LogsDirectory=edgetrain
WorkingDirectory=/var/lib/edgetrain
PrivateTmp=yes
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=read-only

[Install]
WantedBy=multi-user.target
`;
}

export const INSTALL_USAGE = `usage: edgetrain-device install-service --config FILE [--user USER] [-o FILE] [--node PATH]
  Write a systemd unit that runs this device at boot, restarts it on failure, as USER.
  --config FILE   the device's config file, as the service will read it
  --user USER     unprivileged user the device runs as (default: edgetrain)
  -o, --output F  write the unit here, e.g. /etc/systemd/system/edgetrain-device.service (default: standard output)
  --node PATH     the Node.js that runs the device (default: this one)`;

/** `install-service`: write the unit (to `--output`, else standard output); 2 with one line for a bad option. */
export function installService(argv: string[]): number {
  let values;
  try {
    ({ values } = parseArgs({ args: argv, options: { config: { type: "string" }, user: { type: "string" },
      output: { type: "string", short: "o" }, node: { type: "string" }, help: { type: "boolean", short: "h" } } }));
  } catch (exc) {
    return fail(`${(exc as Error).message} (see edgetrain-device install-service --help)`);
  }
  if (values.help) {
    console.log(INSTALL_USAGE);
    return 0;
  }
  if (values.config === undefined) return fail("--config: the device's config file is required");
  if (!existsSync(values.config) || !statSync(values.config).isFile()) return fail(`--config: no file at ${values.config}`);
  let text: string;
  try {
    text = serviceUnit(values.config, { user: values.user, node: values.node });
  } catch (exc) {
    return fail(`--user: ${(exc as Error).message}`);
  }
  if (values.output === undefined) {
    process.stdout.write(text);
    return 0;
  }
  try {
    writeFileSync(`${values.output}.tmp`, text);
    renameSync(`${values.output}.tmp`, values.output); // a unit is never seen half written
  } catch (exc) {
    return fail(`--output: cannot write it: ${(exc as Error).message}`);
  }
  const name = basename(values.output);
  console.error(`wrote ${values.output}; enable it with: systemctl daemon-reload && systemctl enable --now ${name}`);
  return 0;
}

function fail(message: string): number {
  console.error(`error: ${message}`);
  return 2;
}
