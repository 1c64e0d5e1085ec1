import type { NextFunction, Request, Response } from "express";
import { badRequest } from "./errors.js";

/** Deeper JSON than this is refused: no request of E2B's API nests more than a few levels. */
export const MAX_JSON_DEPTH = 32;

/**
 * What PostgreSQL, Redis and the nodes cannot store or would choke on, found in a parsed value: a NUL character
 * in a key or string (PostgreSQL's text and jsonb reject it), or nesting past MAX_JSON_DEPTH (recursive
 * serializers overflow the stack). Iterative, so a hostile value cannot overflow this check either. Returns where
 * and what, or undefined.
 */
export function unsafeValue(value: unknown, root: string): string | undefined {
  const stack: { value: unknown; path: string; depth: number }[] = [{ value, path: root, depth: 0 }];
  while (stack.length > 0) {
    const { value: current, path, depth } = stack.pop() as { value: unknown; path: string; depth: number };
    if (typeof current === "string") {
      if (current.includes("\0")) return `${path} contains a NUL character`;
      continue;
    }
    if (typeof current !== "object" || current === null) continue;
    if (depth >= MAX_JSON_DEPTH) return `${path} is nested deeper than ${MAX_JSON_DEPTH} levels`;
    const entries = Array.isArray(current)
      ? current.map((item, i) => [String(i), item] as const)
      : Object.entries(current as Record<string, unknown>);
    for (const [key, item] of entries) {
      if (key.includes("\0")) return `${path} has a key with a NUL character`;
      stack.push({
        value: item,
        path: Array.isArray(current) ? `${path}[${key}]` : `${path}.${key}`,
        depth: depth + 1,
      });
    }
  }
  return undefined;
}

/** Refuses (400, naming the field) bodies and query strings no store accepts, before any route sees them. */
export function rejectUnsafeInput(req: Request, _res: Response, next: NextFunction): void {
  const problem = unsafeValue(req.body, "body") ?? unsafeValue(req.query, "query");
  if (problem) throw badRequest(problem);
  next();
}

/** PostgreSQL keeps timestamps from 4713 BC; clients have no business outside years 1–9999. */
export function inDateRange(date: Date): boolean {
  const year = date.getUTCFullYear();
  return !Number.isNaN(date.getTime()) && year >= 1 && year <= 9999;
}
