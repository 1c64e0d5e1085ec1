/** One forwarded request or upgraded connection, as the proxy tracks it per sandbox. */
export interface OpenConnection {
  readonly sandboxId: string;
  readonly exec: string;
  /** Tears the exchange down on both sides (the sandbox went away). */
  readonly cut: () => void;
}

/**
 * Open exchanges per sandbox: enforces the per-sandbox concurrency limit (E2B's 429) and lets
 * the proxy reset every stream of an incarnation that was killed, paused or replaced.
 */
export class SandboxConnections {
  private readonly bySandbox = new Map<string, Set<OpenConnection>>();
  private count = 0;

  /** `limit` 0 means unlimited. */
  constructor(readonly limit: number) {}

  /** Registers an exchange; undefined when the sandbox is already at its limit. */
  open(sandboxId: string, exec: string, cut: () => void): OpenConnection | undefined {
    let open = this.bySandbox.get(sandboxId);
    if (open === undefined) {
      open = new Set();
      this.bySandbox.set(sandboxId, open);
    } else if (this.limit > 0 && open.size >= this.limit) {
      return undefined;
    }
    const connection: OpenConnection = { sandboxId, exec, cut };
    open.add(connection);
    this.count += 1;
    return connection;
  }

  close(connection: OpenConnection): void {
    const open = this.bySandbox.get(connection.sandboxId);
    if (!open?.delete(connection)) return;
    this.count -= 1;
    if (open.size === 0) this.bySandbox.delete(connection.sandboxId);
  }

  /** Cuts the sandbox's exchanges whose incarnation `shouldCut` selects; returns how many. */
  cut(sandboxId: string, shouldCut: (exec: string) => boolean): number {
    const open = this.bySandbox.get(sandboxId);
    if (!open) return 0;
    let cut = 0;
    for (const connection of [...open]) {
      if (!shouldCut(connection.exec)) continue;
      this.close(connection);
      connection.cut();
      cut += 1;
    }
    return cut;
  }

  cutAll(): void {
    for (const sandboxId of [...this.bySandbox.keys()]) this.cut(sandboxId, () => true);
  }

  get total(): number {
    return this.count;
  }

  openFor(sandboxId: string): number {
    return this.bySandbox.get(sandboxId)?.size ?? 0;
  }
}
