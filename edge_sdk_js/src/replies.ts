/**
 * What the device waits for while it works: the server's next reply. Follow-up instructions that
 * come meanwhile wait in the session's queue (docs/protocol.md, "Session"); an `error` from the
 * server is a refusal, a `bye` the end of training.
 */
import { DeviceRefused } from "./errors.js";
import type { Message } from "./messages.js";
import type { Channel } from "./transport.js";

/** The server said goodbye: training is over. */
export class ServerBye extends Error {
  constructor(reason: string) {
    super(reason);
    this.name = "ServerBye";
  }
}

/** The next message that is not a queued follow-up instruction (unless `idle`: then it is the work). */
export async function nextReply(ch: Channel, idle = false): Promise<Message> {
  for (;;) {
    const msg = await ch.recv();
    if (msg.t === "instruction" && !(idle && ch.session.instruction === msg)) continue;
    if (msg.t === "error") throw new DeviceRefused(`${msg.code}: ${msg.message}`);
    if (msg.t === "bye") throw new ServerBye(msg.reason);
    return msg;
  }
}
