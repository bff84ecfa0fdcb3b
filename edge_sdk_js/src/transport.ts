/**
 * The protocol over a websocket: the browser's own `WebSocket`, or `ws` in Node (both offer the
 * same event API). Every message sent or received goes through the connection's `DeviceSession`
 * first; one protocol message is one binary websocket message (a text message is `malformed`).
 */
import { DeviceRefused, ErrorCode, ProtocolError } from "./errors.js";
import { decode, encode, type Limits, type Message } from "./messages.js";
import { DeviceSession } from "./session.js";

/** What this SDK needs of a websocket: the WHATWG API, which `ws` implements too. */
export interface WebSocketLike {
  binaryType: string;
  readonly readyState: number;
  readonly bufferedAmount: number;
  send(data: Uint8Array): void;
  close(code?: number, reason?: string): void;
  addEventListener(type: string, listener: (event: any) => void): void;
}

/**
 * Opens a websocket to `url`; `maxMessageBytes` bounds one incoming message where the implementation can, and
 * `headers` (the upgrade request's `Authorization`) go with the request where it can set them (Node's `ws`).
 */
export type WebSocketFactory = (url: string, maxMessageBytes: number, headers?: Record<string, string>) => WebSocketLike;

/** The connection ended (closed by the peer, or lost): the device reconnects. */
export class ConnectionLost extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ConnectionLost";
  }
}

/**
 * An opening handshake answered 401 or 403 (Node's `ws` says "Unexpected server response: 401", and with
 * `withRefusalReason` the server's reason after it): the door refused this device's token, proof or ticket. That is a
 * refusal, as the Python device takes it (edge_sdk.client), not a failure to retry; a browser is not told the status.
 */
export function doorRefusal(message: string | undefined): DeviceRefused | null {
  const found = /^Unexpected server response: (401|403)(?:: ([^]*))?$/.exec(message ?? "");
  if (!found) return null;
  const reason = (found[2] ?? "").trim().split("\n")[0] || `HTTP ${found[1]} on the websocket upgrade`;
  return new DeviceRefused(`${found[1] === "401" ? "unauthorized" : "forbidden"}: ${reason}`);
}

/** Bytes the socket may buffer before `send` waits (two frames, as the Python SDK's write limit). */
const WRITE_LIMIT = 2 << 20;

export class Channel {
  readonly session = new DeviceSession();
  private readonly queue: (Message | ProtocolError)[] = [];
  private waiter: (() => void) | null = null;
  private closed: string | null = null;
  /** The reason of a `bye` the server sent, once one came: training is over, even where the device was
   * busy (training, forwarding) until after the server closed, and its next send meets a closed socket. */
  private byeReason: string | null = null;

  private constructor(private readonly ws: WebSocketLike, private readonly limits: Limits) {
    ws.addEventListener("message", (event: { data: unknown }) => this.onMessage(event.data));
    ws.addEventListener("close", (event: { code?: number; reason?: string }) => {
      this.closed = `connection closed (${event.code ?? ""} ${event.reason ?? ""})`.trim();
      this.wake();
    });
    ws.addEventListener("error", () => {
      this.closed ??= "connection error";
      this.wake();
    });
  }

  /** Connect; resolves once the websocket is open. */
  static open(factory: WebSocketFactory, url: string, limits: Limits, headers: Record<string, string> = {}): Promise<Channel> {
    const ws = factory(url, limits.maxMessageBytes, headers);
    ws.binaryType = "arraybuffer";
    return new Promise((resolve, reject) => {
      ws.addEventListener("open", () => resolve(new Channel(ws, limits)));
      ws.addEventListener("error", (event: { message?: string }) =>
        reject(doorRefusal(event.message) ?? new ConnectionLost(`cannot connect to ${url}: ${event.message ?? "error"}`)));
      ws.addEventListener("close", () => reject(new ConnectionLost(`cannot connect to ${url}`)));
    });
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = null;
    w?.();
  }

  private onMessage(data: unknown): void {
    let item: Message | ProtocolError;
    try {
      if (typeof data === "string") throw new ProtocolError(ErrorCode.MALFORMED, "text websocket message: the protocol uses binary messages only");
      const bytes = data instanceof ArrayBuffer ? new Uint8Array(data) : new Uint8Array((data as Uint8Array).buffer, (data as Uint8Array).byteOffset, (data as Uint8Array).byteLength);
      item = decode(bytes, this.limits);
    } catch (exc) {
      item = exc instanceof ProtocolError ? exc : new ProtocolError(ErrorCode.MALFORMED, String(exc));
    }
    if (!(item instanceof ProtocolError) && item.t === "bye") this.byeReason = item.reason;
    this.queue.push(item);
    this.wake();
  }

  /** The reason of the server's goodbye, if one came on this connection (read or not); else null. */
  get farewell(): string | null {
    return this.byeReason;
  }

  /** The next message, checked by the session; throws `ProtocolError` for bad input, `ConnectionLost` at the end. */
  async recv(): Promise<Message> {
    for (;;) {
      const item = this.queue.shift();
      if (item instanceof ProtocolError) throw item;
      if (item !== undefined) {
        if (!this.session.receive(item)) continue;  // it crossed the device's own close: dropped
        return item;
      }
      if (this.closed !== null) throw new ConnectionLost(this.closed);
      await new Promise<void>((resolve) => { this.waiter = resolve; });
    }
  }

  /** Send one message (checked by the session first); waits while the socket's buffer is full. */
  async send(msg: Message): Promise<void> {
    if (this.closed !== null) throw new ConnectionLost(this.closed);
    this.session.send(msg);
    this.ws.send(encode(msg));
    while (this.ws.bufferedAmount > WRITE_LIMIT && this.closed === null) {
      await new Promise((resolve) => setTimeout(resolve, 2));
    }
  }

  /** Tell the server what went wrong (an `error` message), then close (1009 for too_large, else 1008). */
  sendError(error: ProtocolError): void {
    try {
      if (this.closed === null) {
        this.ws.send(encode({ t: "error", code: error.code, message: error.message.slice(0, 1024) }));
        this.ws.close(error.code === ErrorCode.TOO_LARGE ? 1009 : 1008, error.code.slice(0, 100));
      }
    } catch {
      // the connection is gone already: nothing more to say
    }
  }

  close(): void {
    if (this.closed === null) this.ws.close(1000, "done");
  }
}
