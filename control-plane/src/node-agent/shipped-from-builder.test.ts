import { describe, expect, it } from "vitest";
import type { RuntimeDriver, SnapshotImage, TemplateImage } from "../runtime/driver.js";
import type { BuiltTemplate } from "../templates/store.js";
import { AgentError } from "./errors.js";
import { ShippedFromBuilder } from "./shipped-from-builder.js";

const log = { info: () => undefined } as never;
const scratch = { templateId: "scratch", hash: "h", rootfs: "/scratch/rootfs" } as BuiltTemplate;

/** A driver holding `snapshots`, recording what it flattened. */
function driver(snapshots: string[], flattened: string[][]): RuntimeDriver {
  return {
    name: "fake",
    listSnapshots: async () => snapshots.map((snapshotId) => ({ snapshotId }) as SnapshotImage),
    flattenSnapshot: async (snapshotId: string, template: TemplateImage, dest: string) => {
      flattened.push([snapshotId, template.templateId, dest]);
    },
  } as unknown as RuntimeDriver;
}

describe("ShippedFromBuilder", () => {
  it("lists what the store awaits, and a hand-over flattens the snapshot over scratch into the awaited rootfs", async () => {
    const flattened: string[][] = [];
    const shipped = new ShippedFromBuilder(driver(["l1"], flattened), async () => scratch);
    const built = shipped.build("base", "/t/base.tmp/rootfs", log);
    expect(shipped.wanted()).toEqual(["base"]);
    await expect(shipped.build("base", "/elsewhere", log)).rejects.toThrow(/already awaited/);
    await shipped.adopt("base", "l1", "b-1");
    expect(await built).toEqual({ buildId: "b-1", snapshotId: "l1" });
    expect(flattened).toEqual([["l1", "scratch", "/t/base.tmp/rootfs"]]);
    expect(shipped.wanted()).toEqual([]);
  });

  it("refuses a template it does not await and a snapshot it does not hold, and keeps waiting", async () => {
    const flattened: string[][] = [];
    const shipped = new ShippedFromBuilder(driver(["l1"], flattened), async () => scratch);
    void shipped.build("base", "/t/rootfs", log);
    const refused = (p: Promise<void>) =>
      p.then(
        () => undefined,
        (e: AgentError) => e,
      );
    expect((await refused(shipped.adopt("code-interpreter-v1", "l1", "b")))?.code).toBe("failed_precondition");
    expect((await refused(shipped.adopt("base", "l9", "b")))?.code).toBe("not_found");
    expect(flattened).toEqual([]);
    expect(shipped.wanted()).toEqual(["base"]);
  });

  it("an agent that stops fails what it still awaits instead of waiting for ever", async () => {
    const shipped = new ShippedFromBuilder(driver([], []), async () => scratch);
    const built = shipped.build("base", "/t/rootfs", log);
    shipped.close();
    await expect(built).rejects.toThrow(/stopped before the template builder handed 'base' over/);
    expect(shipped.wanted()).toEqual([]);
  });

  it("a driver that cannot flatten says so", async () => {
    const shipped = new ShippedFromBuilder({ name: "microvm" } as unknown as RuntimeDriver, async () => scratch);
    void shipped.build("base", "/t/rootfs", log);
    const error = await shipped.adopt("base", "l1", "b").catch((e: AgentError) => e);
    expect(error).toBeInstanceOf(AgentError);
    expect((error as AgentError).code).toBe("unimplemented");
  });
});
