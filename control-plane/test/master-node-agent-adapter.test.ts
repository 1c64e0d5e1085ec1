import http from "node:http";
import type { AddressInfo } from "node:net";
import { Code, ConnectError, type ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { NodeAgentService, SandboxState } from "@warren/proto/nodeagent/v1/node_agent_pb";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ConnectNodeAgentClient } from "../src/master/connect-node-agent-client.js";
import { NodeAgentError } from "../src/master/node-agent-client.js";

/** The adapter from NodeAgentClient to the generated warren.nodeagent.v1 client, against a stub service. */
describe("Connect node agent adapter", () => {
  let server: http.Server;
  let client: ConnectNodeAgentClient;
  const seen: Record<string, unknown>[] = [];
  const egressUpdates: { sandboxId: string; allowOut: string[]; denyOut: string[] }[] = [];

  beforeAll(async () => {
    const routes = (router: ConnectRouter) =>
      router.service(NodeAgentService, {
        create(req) {
          seen.push({ ...req });
          if (req.templateId === "full") throw new ConnectError("node is full", Code.ResourceExhausted);
          if (req.templateId === "missing") throw new ConnectError("unknown template", Code.NotFound);
          return {
            sandboxId: req.sandboxId,
            exec: "exec-1",
            sandboxAddr: "10.1.0.2",
            envdUrl: "http://10.1.0.2:49983",
            envdVersion: "0.6.4",
          };
        },
        kill(req) {
          if (req.sandboxId === "gone") throw new ConnectError("no such sandbox", Code.NotFound);
          return {};
        },
        list() {
          return {
            sandboxes: [
              { sandboxId: "a", exec: "e1", state: SandboxState.RUNNING },
              { sandboxId: "b", exec: "e2", state: SandboxState.PAUSED },
            ],
          };
        },
        pause() {
          throw new ConnectError("pause comes later", Code.Unimplemented);
        },
        updateEgress(req) {
          if (req.sandboxId === "gone") throw new ConnectError("no such sandbox", Code.NotFound);
          egressUpdates.push({
            sandboxId: req.sandboxId,
            allowOut: [...(req.egress?.allowOut ?? [])],
            denyOut: [...(req.egress?.denyOut ?? [])],
          });
          return {};
        },
        resume(req) {
          return { placement: { sandboxId: req.sandboxId, exec: "exec-2", sandboxAddr: "10.1.0.2", envdUrl: "u" } };
        },
      });
    server = http.createServer(connectNodeAdapter({ routes }));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    client = new ConnectNodeAgentClient(`127.0.0.1:${(server.address() as AddressInfo).port}`);
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  const request = (templateId: string) => ({
    sandboxId: "sbx1",
    teamId: "team",
    templateId,
    resources: { cpuCount: 2, memoryMB: 512, diskSizeMB: 2048 },
    envVars: { A: "1" },
    envdAccessToken: "tok",
    trafficTokenHash: "",
    publicTraffic: true,
    autoResume: false,
    metadata: { m: "v" },
    egress: { allowOut: ["1.1.1.1", "*.example.com"], denyOut: ["0.0.0.0/0"] },
  });

  it("create sends the sandbox's fields and returns the placement", async () => {
    const placement = await client.create(request("base"));
    expect(placement).toEqual({
      exec: "exec-1",
      sandboxAddr: "10.1.0.2",
      envdUrl: "http://10.1.0.2:49983",
      envdVersion: "0.6.4",
    });
    expect(seen.at(-1)).toMatchObject({
      sandboxId: "sbx1",
      teamId: "team",
      envVars: { A: "1" },
      envdAccessToken: "tok",
      publicTraffic: true,
      metadata: { m: "v" },
    });
    expect(seen.at(-1)?.resources).toMatchObject({ cpuCount: 2, memoryMb: 512, diskSizeMb: 2048 });
    expect((seen.at(-1) as { egress?: unknown } | undefined)?.egress).toMatchObject({
      allowOut: ["1.1.1.1", "*.example.com"],
      denyOut: ["0.0.0.0/0"],
    });
  });

  it("updateEgress sends the policy; an unknown sandbox is not_found", async () => {
    await client.updateEgress("sbx1", { allowOut: ["10.0.0.0/8"], denyOut: [] });
    expect(egressUpdates.at(-1)).toEqual({ sandboxId: "sbx1", allowOut: ["10.0.0.0/8"], denyOut: [] });
    await expect(client.updateEgress("gone", { allowOut: [], denyOut: [] })).rejects.toMatchObject({
      kind: "not_found",
    });
  });

  it("a full node or a node without the template is a refusal (try another node)", async () => {
    await expect(client.create(request("full"))).rejects.toMatchObject({ kind: "refused" });
    await expect(client.create(request("missing"))).rejects.toMatchObject({ kind: "refused" });
  });

  it("kill of a sandbox the node does not have is not_found; list maps states", async () => {
    await expect(client.kill("gone")).rejects.toBeInstanceOf(NodeAgentError);
    await expect(client.kill("gone")).rejects.toMatchObject({ kind: "not_found" });
    await client.kill("there");
    expect(await client.list()).toEqual([
      { sandboxId: "a", exec: "e1", state: "running" },
      { sandboxId: "b", exec: "e2", state: "paused" },
    ]);
  });

  it("an unimplemented pause is reported as such; resume returns the new incarnation", async () => {
    await expect(client.pause("a", true)).rejects.toMatchObject({ kind: "unimplemented" });
    const placement = await client.resume({
      sandboxId: "a",
      teamId: "t",
      envdAccessToken: "x",
      envVars: {},
      memory: true,
    });
    expect(placement.exec).toBe("exec-2");
  });

  it("an unreachable node agent is unavailable", async () => {
    const dead = new ConnectNodeAgentClient("127.0.0.1:1");
    await expect(dead.list()).rejects.toMatchObject({ kind: "unavailable" });
  });
});
