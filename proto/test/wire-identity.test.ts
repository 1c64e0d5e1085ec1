import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fromBinary } from "@bufbuild/protobuf";
import {
  type DescriptorProto,
  type EnumDescriptorProto,
  type FileDescriptorProto,
  FileDescriptorProtoSchema,
} from "@bufbuild/protobuf/wkt";
import { file_filesystem_filesystem } from "@warren/proto/filesystem/filesystem_pb";
import { file_process_process } from "@warren/proto/process/process_pb";
import { describe, expect, it } from "vitest";

/** The descriptors the official e2b SDK was compiled with, read out of its bundle. */
function e2bDescriptors(): Map<string, FileDescriptorProto> {
  const require = createRequire(join(process.cwd(), "envd", "package.json"));
  const bundle = readFileSync(join(dirname(require.resolve("e2b")), "index.mjs"), "utf8");
  const found = new Map<string, FileDescriptorProto>();
  for (const match of bundle.matchAll(/fileDesc\("([A-Za-z0-9+/_=-]+)"/g)) {
    const base64 = (match[1] ?? "").replace(/-/g, "+").replace(/_/g, "/");
    const file = fromBinary(FileDescriptorProtoSchema, Buffer.from(base64, "base64"));
    found.set(file.name, file);
  }
  return found;
}

/** Everything that decides the wire and JSON form, nothing that is only documentation. */
function wireShape(file: FileDescriptorProto) {
  const enumShape = (e: EnumDescriptorProto) => ({
    name: e.name,
    values: e.value.map((v) => [v.name, v.number]),
  });
  const messageShape = (m: DescriptorProto): unknown => ({
    name: m.name,
    fields: m.field.map((f) => ({
      name: f.name,
      number: f.number,
      type: f.type,
      label: f.label,
      typeName: f.typeName,
      oneofIndex: f.oneofIndex,
      proto3Optional: f.proto3Optional,
    })),
    oneofs: m.oneofDecl.map((o) => o.name),
    nested: m.nestedType.map(messageShape),
    enums: m.enumType.map(enumShape),
    mapEntry: m.options?.mapEntry ?? false,
  });
  return {
    // Imports are left out: embedded descriptors drop them; field type names still pin them.
    package: file.package,
    messages: file.messageType.map(messageShape),
    enums: file.enumType.map(enumShape),
    services: file.service.map((s) => ({
      name: s.name,
      methods: s.method.map((m) => [m.name, m.inputType, m.outputType, !!m.clientStreaming, !!m.serverStreaming]),
    })),
  };
}

describe("envd protos are wire-identical to the e2b SDK's", () => {
  const theirs = e2bDescriptors();

  it("process/process.proto matches the descriptor embedded in e2b@2.51.0", () => {
    const e2b = theirs.get("process/process.proto");
    expect(e2b).toBeDefined();
    expect(wireShape(file_process_process.proto)).toEqual(wireShape(e2b as FileDescriptorProto));
  });

  it("filesystem/filesystem.proto matches the descriptor embedded in e2b@2.51.0", () => {
    const e2b = theirs.get("filesystem/filesystem.proto");
    expect(e2b).toBeDefined();
    expect(wireShape(file_filesystem_filesystem.proto)).toEqual(wireShape(e2b as FileDescriptorProto));
  });

  it("EndEvent.exit_code is field 1 of type sint32", () => {
    const processEvent = file_process_process.proto.messageType.find((m) => m.name === "ProcessEvent");
    const endEvent = processEvent?.nestedType.find((m) => m.name === "EndEvent");
    const exitCode = endEvent?.field.find((f) => f.name === "exit_code");
    expect(exitCode?.number).toBe(1);
    expect(exitCode?.type).toBe(17); // TYPE_SINT32
  });
});
