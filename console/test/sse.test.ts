import { describe, expect, it } from "vitest";
import { SseParser } from "../src/sse.js";

describe("SseParser (the api's ledger stream read through fetch)", () => {
  it("parses events split across chunks at any byte, with ids, types and multi-line data", () => {
    const stream =
      ': following sandbox events\n\nid: 7\nevent: sandbox.created\ndata: {"a":1}\n\nid: 8\ndata: one\ndata: two\n\n';
    for (let cut = 1; cut < stream.length; cut++) {
      const parser = new SseParser();
      const events = [...parser.push(stream.slice(0, cut)), ...parser.push(stream.slice(cut))];
      expect(events, `cut at ${cut}`).toEqual([
        { id: "7", event: "sandbox.created", data: '{"a":1}' },
        { id: "8", event: "message", data: "one\ntwo" },
      ]);
    }
  });

  it("accepts CRLF and CR line ends, even with the CR and LF in different chunks", () => {
    const parser = new SseParser();
    const events = [
      ...parser.push("id: 1\r\ndata: x\r"),
      ...parser.push("\n\r\n"),
      ...parser.push("data: y\r\r: next\n"),
    ];
    expect(events).toEqual([
      { id: "1", event: "message", data: "x" },
      { id: "1", event: "message", data: "y" },
    ]);
  });

  it("ignores comments, unknown fields and blank-line runs without data", () => {
    const parser = new SseParser();
    expect(parser.push(":keepalive\n\n\nretry: 5\nfoo: bar\n\n")).toEqual([]);
  });
});
