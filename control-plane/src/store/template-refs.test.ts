import { describe, expect, it } from "vitest";
import { parseTag, parseTemplateName, TemplateNameError } from "./template-refs.js";

describe("template names as E2B parses them", () => {
  it("splits namespace, alias and tag, lowercased and trimmed; the tag default counts as none", () => {
    expect(parseTemplateName("web")).toEqual({ alias: "web" });
    expect(parseTemplateName(" Web:V1 ")).toEqual({ alias: "web", tag: "v1" });
    expect(parseTemplateName("acme/web:v1.2")).toEqual({ namespace: "acme", alias: "web", tag: "v1.2" });
    expect(parseTemplateName("web:default")).toEqual({ alias: "web" });
    expect(parseTemplateName("my_app-2")).toEqual({ alias: "my_app-2" });
  });

  it("rejects bad names and tags with a message naming the part", () => {
    expect(() => parseTemplateName("")).toThrow("Name is required");
    expect(() => parseTemplateName("bad name")).toThrow(/Invalid name: 'bad name'/);
    expect(() => parseTemplateName("a/b/c")).toThrow(TemplateNameError);
    expect(() => parseTemplateName("ns!/x")).toThrow(/namespace/);
    expect(() => parseTemplateName("web:bad tag")).toThrow(/Invalid tag/);
    expect(() => parseTag("6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f")).toThrow(/UUID/);
    expect(parseTag(" Stable ")).toBe("stable");
  });
});
