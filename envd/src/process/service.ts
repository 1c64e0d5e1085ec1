import type { ServiceImpl } from "@connectrpc/connect";
import type { Process } from "@warren/proto/process/process_pb";
import type { Closable, EnvdContext } from "../context.js";
import { unimplemented } from "../errors.js";

// Placeholder for the process service (being written now); every RPC answers unimplemented.
export function createProcessService(_ctx: EnvdContext): Closable & { impl: Partial<ServiceImpl<typeof Process>> } {
  return {
    impl: {
      list() {
        throw unimplemented("process.Process is not implemented yet");
      },
    },
    async close() {},
  };
}
