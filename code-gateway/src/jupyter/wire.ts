import { createHmac, randomUUID, timingSafeEqual } from "node:crypto";

/**
 * The Jupyter messaging wire format (protocol 5.3): multipart frames
 * `[...identities, "<IDS|MSG>", hmac, header, parent_header, metadata, content, ...buffers]`,
 * signed with HMAC-SHA256 over the four JSON frames. Used by the gateway's kernel client
 * and by the JavaScript kernel, so both sides share one codec.
 */
export interface MessageHeader {
  msg_id: string;
  session: string;
  username: string;
  date: string;
  msg_type: string;
  version: string;
}

export type Content = Record<string, unknown>;

export interface JupyterMessage {
  identities: Buffer[];
  header: MessageHeader;
  parentHeader: Partial<MessageHeader>;
  metadata: Content;
  content: Content;
  buffers: Buffer[];
}

/** Where a kernel listens; the JSON form is Jupyter's connection file. */
export interface ConnectionInfo {
  transport: "ipc" | "tcp";
  ip: string;
  shell_port: number;
  iopub_port: number;
  stdin_port: number;
  control_port: number;
  hb_port: number;
  key: string;
  signature_scheme: "hmac-sha256";
  kernel_name?: string;
}

export type Channel = "shell" | "iopub" | "stdin" | "control" | "hb";

export function endpoint(info: ConnectionInfo, channel: Channel): string {
  const port = info[`${channel}_port`];
  return info.transport === "ipc" ? `ipc://${info.ip}-${port}` : `tcp://${info.ip}:${port}`;
}

const DELIMITER = Buffer.from("<IDS|MSG>");
const PROTOCOL_VERSION = "5.3";

export class WireError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "WireError";
  }
}

export class WireCodec {
  readonly session = randomUUID();

  constructor(
    private readonly key: string,
    private readonly username = "warren",
  ) {}

  /** A new message; `parent` links replies and outputs to the request they answer. */
  encode(
    msgType: string,
    content: Content,
    options: { parent?: Partial<MessageHeader>; identities?: Buffer[]; metadata?: Content; msgId?: string } = {},
  ): { frames: Buffer[]; header: MessageHeader } {
    const header: MessageHeader = {
      msg_id: options.msgId ?? randomUUID(),
      session: this.session,
      username: this.username,
      date: new Date().toISOString(),
      msg_type: msgType,
      version: PROTOCOL_VERSION,
    };
    const parts = [header, options.parent ?? {}, options.metadata ?? {}, content].map((p) =>
      Buffer.from(JSON.stringify(p)),
    );
    const frames = [...(options.identities ?? []), DELIMITER, Buffer.from(this.sign(parts)), ...parts];
    return { frames, header };
  }

  /** Parses and verifies one multipart message; throws WireError if it is malformed or badly signed. */
  decode(frames: Buffer[]): JupyterMessage {
    const at = frames.findIndex((f) => f.equals(DELIMITER));
    if (at === -1 || frames.length < at + 6) throw new WireError("message without <IDS|MSG> delimiter or frames");
    const signature = frames[at + 1]!;
    const parts = frames.slice(at + 2, at + 6);
    if (this.key) {
      const expected = Buffer.from(this.sign(parts));
      if (signature.length !== expected.length || !timingSafeEqual(signature, expected)) {
        throw new WireError("message signature does not match");
      }
    }
    const [header, parentHeader, metadata, content] = parts.map((p) => JSON.parse(p.toString("utf8")) as unknown);
    return {
      identities: frames.slice(0, at),
      header: header as MessageHeader,
      parentHeader: parentHeader as Partial<MessageHeader>,
      metadata: metadata as Content,
      content: content as Content,
      buffers: frames.slice(at + 6),
    };
  }

  private sign(parts: Buffer[]): string {
    if (!this.key) return "";
    const hmac = createHmac("sha256", this.key);
    for (const part of parts) hmac.update(part);
    return hmac.digest("hex");
  }
}

/**
 * zeromq 6 allows one send in flight per socket; this serialises sends so callers
 * never see "Socket is busy writing".
 */
export class SerialSender {
  private tail: Promise<void> = Promise.resolve();

  constructor(private readonly socket: { send(frames: Buffer[]): Promise<void> }) {}

  send(frames: Buffer[]): Promise<void> {
    const next = this.tail.then(() => this.socket.send(frames));
    this.tail = next.catch(() => undefined);
    return next;
  }
}
