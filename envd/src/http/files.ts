import type { IncomingMessage, ServerResponse } from "node:http";
import type { EnvdContext } from "../context.js";
import { sendJsonError } from "./respond.js";

// Placeholder for GET/POST /files (being written now).
export async function handleFiles(_req: IncomingMessage, res: ServerResponse, _ctx: EnvdContext): Promise<void> {
  sendJsonError(res, 501, "/files is not implemented yet");
}
