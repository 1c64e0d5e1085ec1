/**
 * The changes between two versions of the OpenAPI document that break a client built against the older one:
 *   - an operation (path + method) or one of its answer statuses is removed;
 *   - a request or answer property is removed, or its type changes in the direction that hurts:
 *     a request accepting fewer types or enum values, an answer sending more;
 *   - a request property or parameter becomes required (or a required one is added); an answer property stops
 *     being required (clients read it unconditionally).
 * Adding operations, statuses, optional request fields or answer fields is not breaking.
 */

const METHODS = ["get", "put", "post", "delete", "patch", "head", "options"];

/** `#/components/schemas/X` (or any local pointer) resolved in its document; other values returned as they are. */
function resolve(document, schema) {
  let current = schema;
  for (let hops = 0; current && typeof current.$ref === "string" && hops < 32; hops++) {
    const segments = current.$ref.replace(/^#\//, "").split("/");
    current = segments.reduce((node, s) => node?.[s.replace(/~1/g, "/").replace(/~0/g, "~")], document);
  }
  return current ?? {};
}

/** A schema flattened for comparison: allOf merged, oneOf/anyOf branches' properties united. */
function view(document, raw) {
  const schema = resolve(document, raw);
  const result = {
    types: typesOf(schema),
    properties: { ...(schema.properties ?? {}) },
    required: new Set(schema.required ?? []),
    items: schema.items,
    additionalProperties: typeof schema.additionalProperties === "object" ? schema.additionalProperties : undefined,
    enum: Array.isArray(schema.enum) ? schema.enum : schema.const !== undefined ? [schema.const] : undefined,
  };
  for (const part of schema.allOf ?? []) {
    const merged = view(document, part);
    Object.assign(result.properties, merged.properties);
    for (const name of merged.required) result.required.add(name);
    if (!result.types && merged.types) result.types = merged.types;
    result.items ??= merged.items;
  }
  for (const branch of [...(schema.oneOf ?? []), ...(schema.anyOf ?? [])]) {
    const merged = view(document, branch);
    for (const [name, property] of Object.entries(merged.properties)) result.properties[name] ??= property;
  }
  return result;
}

function typesOf(schema) {
  if (schema.type === undefined) return undefined;
  return new Set(Array.isArray(schema.type) ? schema.type : [schema.type]);
}

/**
 * Compares a schema across versions. `direction` is "request" (the client writes it) or "response" (it reads it).
 * Pushes one line per breaking change to `out`.
 */
function compareSchemas(ctx, where, oldRaw, newRaw, direction, depth = 0) {
  if (depth > 24 || !oldRaw || !newRaw) return;
  const key = `${direction}:${JSON.stringify(oldRaw).slice(0, 200)}|${JSON.stringify(newRaw).slice(0, 200)}|${where}`;
  if (ctx.seen.has(key)) return;
  ctx.seen.add(key);
  const before = view(ctx.oldDoc, oldRaw);
  const after = view(ctx.newDoc, newRaw);
  if (before.types && after.types) {
    // An integer is a number: integer -> number widens a request, number -> integer narrows an answer.
    const lost = [...before.types].filter(
      (t) => !after.types.has(t) && !(t === "integer" && after.types.has("number")),
    );
    const gained = [...after.types].filter(
      (t) => !before.types.has(t) && !(t === "integer" && before.types.has("number")),
    );
    if (direction === "request" && lost.length > 0) ctx.out.push(`${where}: no longer accepts type ${lost.join(", ")}`);
    if (direction === "response" && gained.length > 0)
      ctx.out.push(`${where}: may now be of type ${gained.join(", ")}`);
  } else if (direction === "request" && !before.types && !before.enum && after.types) {
    ctx.out.push(`${where}: now restricted to type ${[...after.types].join(", ")}`);
  }
  if (before.enum && after.enum) {
    const lost = before.enum.filter((v) => !after.enum.includes(v));
    const gained = after.enum.filter((v) => !before.enum.includes(v));
    if (direction === "request" && lost.length > 0) {
      ctx.out.push(`${where}: no longer accepts ${lost.map((v) => JSON.stringify(v)).join(", ")}`);
    }
    if (direction === "response" && gained.length > 0) {
      ctx.out.push(`${where}: may now answer ${gained.map((v) => JSON.stringify(v)).join(", ")}`);
    }
  } else if (direction === "request" && !before.enum && after.enum) {
    ctx.out.push(`${where}: now restricted to ${after.enum.map((v) => JSON.stringify(v)).join(", ")}`);
  }
  for (const [name, property] of Object.entries(before.properties)) {
    const next = after.properties[name];
    if (next === undefined) {
      ctx.out.push(`${where}.${name}: removed`);
      continue;
    }
    compareSchemas(ctx, `${where}.${name}`, property, next, direction, depth + 1);
  }
  if (direction === "request") {
    for (const name of after.required) {
      if (!before.required.has(name)) ctx.out.push(`${where}.${name}: became required`);
    }
  } else {
    for (const name of before.required) {
      if (!after.required.has(name) && after.properties[name] !== undefined) {
        ctx.out.push(`${where}.${name}: no longer always answered (not required)`);
      }
    }
  }
  if (before.items && after.items) compareSchemas(ctx, `${where}[]`, before.items, after.items, direction, depth + 1);
  if (before.additionalProperties && after.additionalProperties) {
    compareSchemas(ctx, `${where}{}`, before.additionalProperties, after.additionalProperties, direction, depth + 1);
  }
}

function jsonSchemaOf(content) {
  return content?.["application/json"]?.schema;
}

function compareParameters(ctx, where, before, after) {
  const key = (p) => `${p.in}:${p.name}`;
  const old = new Map((before ?? []).map((p) => [key(p), p]));
  for (const parameter of after ?? []) {
    const previous = old.get(key(parameter));
    const label = `${where} ${parameter.in} parameter ${parameter.name}`;
    if (parameter.required && !previous?.required) ctx.out.push(`${label}: became required`);
    if (previous?.schema && parameter.schema) {
      compareSchemas(ctx, label, previous.schema, parameter.schema, "request");
    }
  }
}

/** The breaking changes from `oldDoc` to `newDoc`, one line each (empty: compatible). */
export function breakingChanges(oldDoc, newDoc) {
  const ctx = { oldDoc, newDoc, out: [], seen: new Set() };
  for (const [path, oldItem] of Object.entries(oldDoc.paths ?? {})) {
    const newItem = newDoc.paths?.[path];
    for (const method of METHODS) {
      const before = oldItem?.[method];
      if (!before) continue;
      const where = `${method.toUpperCase()} ${path}`;
      const after = newItem?.[method];
      if (!after) {
        ctx.out.push(`${where}: operation removed`);
        continue;
      }
      compareParameters(
        ctx,
        where,
        [...(oldItem.parameters ?? []), ...(before.parameters ?? [])],
        [...(newItem.parameters ?? []), ...(after.parameters ?? [])],
      );
      const oldBody = jsonSchemaOf(before.requestBody?.content);
      const newBody = jsonSchemaOf(after.requestBody?.content);
      if (oldBody && newBody) compareSchemas(ctx, `${where} request`, oldBody, newBody, "request");
      if (!before.requestBody?.required && after.requestBody?.required) {
        ctx.out.push(`${where} request: body became required`);
      }
      for (const [status, response] of Object.entries(before.responses ?? {})) {
        const next = after.responses?.[status];
        if (!next) {
          ctx.out.push(`${where} ${status}: answer removed`);
          continue;
        }
        const oldAnswer = jsonSchemaOf(response.content);
        const newAnswer = jsonSchemaOf(next.content);
        if (oldAnswer && !newAnswer) ctx.out.push(`${where} ${status}: JSON body removed`);
        if (oldAnswer && newAnswer) compareSchemas(ctx, `${where} ${status}`, oldAnswer, newAnswer, "response");
      }
    }
  }
  return ctx.out;
}
