import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { migrate } from "../src/store/migrations.js";
import { createTeam } from "../src/store/teams.js";
import { findTemplateByRef } from "../src/store/template-refs.js";
import { insertTemplate, ownOrShippedByAlias } from "../src/store/templates.js";
import { testSchema } from "./api-harness.js";

// A create's name lookup in one round trip: the team's own template of that alias, else Warren's shipped one, never
// another team's. Real PostgreSQL, a schema of its own (its migrations ship `base`).
describe("looking a template up by alias for a create", () => {
  const { schema, db, drop } = testSchema();
  let owner = "";
  let other = "";

  beforeAll(async () => {
    await migrate(db, schema);
    owner = (await createTeam(db, "lookup-owner")).id;
    other = (await createTeam(db, "lookup-other")).id;
    const template = { teamId: owner, cpuCount: 1, memoryMB: 512, diskSizeMB: 1024 };
    await insertTemplate(db, { ...template, id: `tpl${randomBytes(4).toString("hex")}`, alias: "base" }, "0.1.0");
    await insertTemplate(db, { ...template, id: `tpl${randomBytes(4).toString("hex")}`, alias: "mine" }, "0.1.0");
  });

  afterAll(drop);

  it("finds the team's own template first, else the shipped one, never another team's", async () => {
    expect(await ownOrShippedByAlias(db, owner, "base")).toMatchObject({ teamId: owner, alias: "base" });
    expect(await ownOrShippedByAlias(db, other, "base")).toMatchObject({ teamId: null, alias: "base" });
    expect(await ownOrShippedByAlias(db, owner, "mine")).toMatchObject({ teamId: owner });
    expect(await ownOrShippedByAlias(db, other, "mine")).toBeUndefined();
    const as = (id: string, name: string) => ({ id, namespace: name });
    expect(await findTemplateByRef(db, as(owner, "lookup-owner"), "base:v1")).toMatchObject({
      owned: true,
      tag: "v1",
      template: { teamId: owner },
    });
    expect(await findTemplateByRef(db, as(other, "lookup-other"), "base")).toMatchObject({
      owned: false,
      template: { teamId: null },
    });
    expect(await findTemplateByRef(db, as(other, "lookup-other"), "mine")).toBeUndefined();
  });
});
