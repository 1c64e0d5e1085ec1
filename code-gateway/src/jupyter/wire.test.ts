import { createHmac } from "node:crypto";
import { describe, expect, it } from "vitest";
import { endpoint, WireCodec, WireError } from "./wire.js";

describe("Jupyter wire codec", () => {
  it("signs the four JSON frames with HMAC-SHA256 and round-trips a message", () => {
    const codec = new WireCodec("secret-key");
    const { frames, header } = codec.encode("execute_request", { code: "1" }, { identities: [Buffer.from("id")] });
    expect(frames[1]?.toString()).toBe("<IDS|MSG>");
    const hmac = createHmac("sha256", "secret-key");
    for (const part of frames.slice(3, 7)) hmac.update(part);
    expect(frames[2]?.toString()).toBe(hmac.digest("hex"));
    const decoded = codec.decode(frames);
    expect(decoded.identities.map(String)).toEqual(["id"]);
    expect(decoded.header).toEqual(header);
    expect(decoded.content).toEqual({ code: "1" });
  });

  it("rejects a message signed with another key or tampered with", () => {
    const { frames } = new WireCodec("other").encode("status", { execution_state: "idle" });
    expect(() => new WireCodec("secret-key").decode(frames)).toThrow(WireError);
    const codec = new WireCodec("secret-key");
    const good = codec.encode("status", { execution_state: "idle" }).frames;
    good[5] = Buffer.from('{"execution_state":"busy"}');
    expect(() => codec.decode(good)).toThrow("signature");
  });

  it("builds ipc and tcp endpoints from a connection file", () => {
    const info = {
      transport: "ipc" as const,
      ip: "/run/k/s",
      shell_port: 1,
      iopub_port: 2,
      stdin_port: 3,
      control_port: 4,
      hb_port: 5,
      key: "",
      signature_scheme: "hmac-sha256" as const,
    };
    expect(endpoint(info, "iopub")).toBe("ipc:///run/k/s-2");
    expect(endpoint({ ...info, transport: "tcp", ip: "127.0.0.1" }, "shell")).toBe("tcp://127.0.0.1:1");
  });
});
