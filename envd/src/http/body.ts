import type { IncomingMessage } from "node:http";
import { invalidArgument } from "../errors.js";

/** Reads a small JSON request body (control requests, never file data) with a size cap. */
export async function readJsonBody(req: IncomingMessage, maxBytes = 1 << 20): Promise<unknown> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > maxBytes) throw invalidArgument(`request body is larger than ${maxBytes} bytes`);
    chunks.push(chunk as Buffer);
  }
  const text = Buffer.concat(chunks).toString("utf8").trim();
  if (text === "") return {};
  try {
    return JSON.parse(text);
  } catch (error) {
    throw invalidArgument(`request body is not valid JSON: ${(error as Error).message}`);
  }
}
