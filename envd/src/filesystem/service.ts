import type { ServiceImpl } from "@connectrpc/connect";
import type { Filesystem } from "@warren/proto/filesystem/filesystem_pb";
import type { Closable, EnvdContext } from "../context.js";
import { unimplemented } from "../errors.js";

// Placeholder for the filesystem service (being written now); every RPC answers unimplemented.
export function createFilesystemService(
  _ctx: EnvdContext,
): Closable & { impl: Partial<ServiceImpl<typeof Filesystem>> } {
  return {
    impl: {
      stat() {
        throw unimplemented("filesystem.Filesystem is not implemented yet");
      },
    },
    async close() {},
  };
}
