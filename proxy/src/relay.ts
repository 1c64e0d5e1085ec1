import { connect, type Socket } from "node:net";
import { RELAY_ERROR_HEADER, RELAY_TOKEN_HEADER } from "@warren/proto/ports";

/**
 * The proxy's side of the node agent relay (control-plane/src/node-agent/relay.ts): a sandbox address is
 * reachable only from its own node, so a proxy elsewhere opens a TCP connection to that node's agent
 * (`route.nodeAddr`), asks `CONNECT <sandboxAddr>:<port>` with the shared token, and once the agent answers 200
 * uses the socket exactly as a direct connection. A refusal or failed dial becomes an error with the errno a direct
 * connect would have had, so retries and 502 bodies are the same on both paths.
 */

// The errno of the agent's failed dial of the sandbox port (ECONNREFUSED, ETIMEDOUT, ...).
const RELAY_ERROR = new RegExp(`^${RELAY_ERROR_HEADER}:[ \\t]*([A-Z0-9_]+)[ \\t]*\\r?$`, "im");
const MAX_RESPONSE_HEAD = 8192;

export interface RelayTunnelTarget {
  /** The node agent, `host:port` (route.nodeAddr). */
  readonly nodeAddr: string;
  readonly host: string;
  readonly port: number;
}

export interface RelayDialer {
  readonly token: string;
  /** The whole handshake (TCP to the agent, CONNECT, the agent's dial) must finish within this. */
  readonly timeoutMs: number;
}

export type TunnelCallback = (error: Error | null, socket?: Socket) => void;

/** Opens a tunnel to `target` through its node agent; `done` gets a socket ready for HTTP, or an errno-coded error. */
export function openRelayTunnel(dialer: RelayDialer, target: RelayTunnelTarget, done: TunnelCallback): void {
  const agent = splitHostPort(target.nodeAddr);
  if (!agent) {
    process.nextTick(done, coded(`route nodeAddr '${target.nodeAddr}' is not host:port`, "EINVAL"));
    return;
  }
  const socket = connect({ host: agent.host, port: agent.port, noDelay: true, keepAlive: true });
  let finished = false;
  const finish = (error: Error | null, rest?: Buffer) => {
    if (finished) return;
    finished = true;
    clearTimeout(timer);
    socket.off("readable", onReadable);
    socket.off("error", finish);
    socket.off("close", onClose);
    if (error) {
      socket.destroy();
      done(error);
      return;
    }
    // Bytes the sandbox sent right after the 200 (a server-first protocol) belong to the next reader.
    if (rest && rest.length > 0) socket.unshift(rest);
    done(null, socket);
  };
  const timer = setTimeout(() => finish(coded("relay connect timeout", "ETIMEDOUT")), dialer.timeoutMs);
  const onClose = () => finish(coded("the node agent closed the relay connection", "ECONNRESET"));
  let received: Buffer = Buffer.alloc(0);
  // Paused mode ('readable' + read()), so that once the listener is gone the stream is neither flowing nor
  // explicitly paused: whoever attaches 'data' next (node:http) gets the unshifted bytes first.
  const onReadable = () => {
    for (let chunk = socket.read() as Buffer | null; chunk !== null; chunk = socket.read() as Buffer | null) {
      received = received.length === 0 ? chunk : Buffer.concat([received, chunk]);
      const end = received.indexOf("\r\n\r\n");
      if (end >= 0) {
        finish(relayError(received.subarray(0, end).toString("latin1")) ?? null, received.subarray(end + 4));
        return;
      }
      if (received.length > MAX_RESPONSE_HEAD) return finish(coded("relay answer head too large", "ERELAYPROTO"));
    }
  };
  socket.on("readable", onReadable);
  socket.on("error", finish);
  socket.on("close", onClose);
  socket.once("connect", () => {
    socket.write(
      `CONNECT ${target.host}:${target.port} HTTP/1.1\r\nHost: ${target.host}:${target.port}\r\n` +
        `${RELAY_TOKEN_HEADER}: ${dialer.token}\r\n\r\n`,
    );
  });
}

/** undefined for a 200; else the error a direct connect would have raised. */
function relayError(head: string): NodeJS.ErrnoException | undefined {
  const status = /^HTTP\/1\.[01] (\d{3})/.exec(head);
  if (!status) return coded("malformed relay answer", "ERELAYPROTO");
  const code = Number(status[1]);
  if (code === 200) return undefined;
  const named = RELAY_ERROR.exec(head)?.[1];
  if (named) {
    return coded(`the node agent could not reach the sandbox port (${named})`, named);
  }
  // 404: no running sandbox at that address on that node — what a direct dial of a vanished address meets.
  if (code === 404) return coded("the node agent has no running sandbox at this address", "EHOSTUNREACH");
  return coded(
    `the node agent refused the relay (${code})`,
    code === 403 || code === 405 ? "ERELAYAUTH" : "ERELAYPROTO",
  );
}

function coded(message: string, code: string): NodeJS.ErrnoException {
  return Object.assign(new Error(message), { code });
}

function splitHostPort(addr: string): { host: string; port: number } | undefined {
  const colon = addr.lastIndexOf(":");
  if (colon <= 0) return undefined;
  const port = Number(addr.slice(colon + 1));
  if (!Number.isInteger(port) || port < 1 || port > 65535) return undefined;
  let host = addr.slice(0, colon);
  if (host.startsWith("[") && host.endsWith("]")) host = host.slice(1, -1);
  return { host, port };
}
