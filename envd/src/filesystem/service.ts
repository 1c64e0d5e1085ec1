import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { Filesystem } from "@warren/proto/filesystem/filesystem_pb";
import { requestUser } from "../auth.js";
import type { Closable, EnvdContext } from "../context.js";
import { resolveUserPath } from "../paths.js";
import type { SandboxUser } from "../users.js";
import { listDirectory } from "./list-dir.js";
import { makeDirectory, moveEntry, removeEntry, statEntry } from "./operations.js";
import { AccessChecker } from "./permissions.js";
import type { WatchRequest } from "./watch.js";
import { keepaliveIntervalMs, watchDirStream } from "./watch-stream.js";
import { WatcherRegistry } from "./watcher-registry.js";

interface Caller {
  user: SandboxUser;
  access: AccessChecker;
  resolve(path: string): string;
}

interface WatchParams {
  path: string;
  recursive: boolean;
  includeEntry: boolean;
  allowNetworkMounts: boolean;
}

/**
 * envd's `filesystem.Filesystem` Connect service (E2B-PROTOCOL.md §3.3). Each call acts as
 * the user of its Basic header (else the sandbox default): paths resolve against their
 * home. Reads, listings, watches and removals are checked against their permissions,
 * although envd runs as root; what MakeDir and Move create is made as in E2B's envd, by
 * root, and handed to them.
 */
export function createFilesystemService(ctx: EnvdContext): Closable & { impl: ServiceImpl<typeof Filesystem> } {
  const registry = new WatcherRegistry(ctx.log);

  const caller = (handler: HandlerContext): Caller => {
    const user = requestUser(handler.requestHeader.get("authorization"), ctx.state, ctx.users);
    return { user, access: new AccessChecker(user), resolve: (path) => resolveUserPath(path, user) };
  };
  const watchRequest = (who: Caller, params: WatchParams): WatchRequest => ({
    path: who.resolve(params.path),
    recursive: params.recursive,
    includeEntry: params.includeEntry,
    allowNetworkMounts: params.allowNetworkMounts,
  });

  const impl: ServiceImpl<typeof Filesystem> = {
    async stat(req, handler) {
      const who = caller(handler);
      return { entry: await statEntry(who.resolve(req.path), who.access, ctx.users) };
    },
    async makeDir(req, handler) {
      const who = caller(handler);
      return { entry: await makeDirectory(who.resolve(req.path), who.user, ctx.users) };
    },
    async move(req, handler) {
      const who = caller(handler);
      const source = who.resolve(req.source);
      const destination = who.resolve(req.destination);
      return { entry: await moveEntry(source, destination, who.user, who.access, ctx.users) };
    },
    async listDir(req, handler) {
      const who = caller(handler);
      return { entries: await listDirectory(who.resolve(req.path), req.depth, who.access, ctx.users) };
    },
    async remove(req, handler) {
      const who = caller(handler);
      await removeEntry(who.resolve(req.path), who.access);
      return {};
    },
    async *watchDir(req, handler) {
      const who = caller(handler);
      const signal = AbortSignal.any([handler.signal, registry.shutdownSignal]);
      const keepaliveMs = keepaliveIntervalMs(handler.requestHeader.get("keepalive-ping-interval"));
      yield* watchDirStream(watchRequest(who, req), who.access, ctx.users, registry, keepaliveMs, signal);
    },
    async createWatcher(req, handler) {
      const who = caller(handler);
      return { watcherId: await registry.create(watchRequest(who, req), who.access, ctx.users) };
    },
    async getWatcherEvents(req) {
      return { events: registry.drain(req.watcherId) };
    },
    async removeWatcher(req) {
      await registry.remove(req.watcherId);
      return {};
    },
  };

  return { impl, close: () => registry.close() };
}
