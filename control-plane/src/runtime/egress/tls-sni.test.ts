import { createServer, type Server } from "node:net";
import { connect } from "node:tls";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { httpHost } from "./gateway.js";
import { readClientHelloSni } from "./tls-sni.js";

/** The first bytes a real TLS client (Node's OpenSSL) sends, captured by a plain TCP server. */
async function clientHello(servername: string | undefined, port: number, server: Server): Promise<Buffer> {
  const captured = new Promise<Buffer>((resolve) => {
    server.once("connection", (socket) => {
      socket.once("data", (chunk: Buffer) => {
        resolve(chunk);
        socket.destroy();
      });
    });
  });
  const tls = connect({ host: "127.0.0.1", port, ...(servername ? { servername } : {}), rejectUnauthorized: false });
  tls.on("error", () => undefined);
  const hello = await captured;
  tls.destroy();
  return hello;
}

describe("TLS SNI and HTTP Host", () => {
  let server: Server;
  let port: number;
  beforeAll(async () => {
    server = createServer();
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", () => resolve()));
    port = (server.address() as { port: number }).port;
  });
  afterAll(() => server.close());

  it("reads the server name of a real ClientHello, byte by byte too", async () => {
    const hello = await clientHello("api.example.com", port, server);
    expect(readClientHelloSni(hello)).toEqual({ name: "api.example.com" });
    expect(readClientHelloSni(hello.subarray(0, 3))).toBe("incomplete");
    expect(readClientHelloSni(hello.subarray(0, hello.length - 1))).toBe("incomplete");
  });

  it("reports a ClientHello without SNI and refuses what is not TLS", async () => {
    const hello = await clientHello(undefined, port, server);
    expect(readClientHelloSni(hello)).toEqual({ name: undefined });
    expect(readClientHelloSni(Buffer.from("GET / HTTP/1.1\r\n"))).toBe("invalid");
    const corrupt = Buffer.from(hello);
    corrupt[5] = 0x02; // a ServerHello is not a ClientHello
    expect(readClientHelloSni(corrupt)).toBe("invalid");
  });

  it("reads the Host header of an HTTP/1 request head", () => {
    expect(httpHost(Buffer.from("GET / HTTP/1.1\r\nHost: Example.com:8080\r\nAccept: */*\r\n\r\n"))).toBe(
      "Example.com",
    );
    expect(httpHost(Buffer.from("GET / HTTP/1.1\r\nHost: a.io\r\n"))).toBe("incomplete");
    expect(httpHost(Buffer.from("GET / HTTP/1.1\r\nAccept: */*\r\n\r\n"))).toBe("invalid");
    expect(httpHost(Buffer.from("\x16\x03\x01junk\r\n\r\n"))).toBe("invalid");
  });
});
