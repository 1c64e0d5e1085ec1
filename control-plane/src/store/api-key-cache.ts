import type { Queryable } from "./db.js";
import { Listener } from "./notify.js";
import { type ApiKeyIdentity, hashApiKey, identifyApiKeyHash } from "./teams.js";

/** Who an API key is: the api's one question about a request's key (api/app.ts). */
export interface ApiKeyIdentities {
  /** The key's identity, or undefined for an unknown or revoked key. */
  identify(key: string): Promise<ApiKeyIdentity | undefined>;
  /** Drops what is known: this replica changed a team or a key (its next request must see the change). */
  forget(): void;
}

/** Every lookup goes to PostgreSQL: the api's default when nothing listens for identity changes. */
export class UncachedApiKeyIdentities implements ApiKeyIdentities {
  constructor(private readonly db: Queryable) {}

  identify(key: string): Promise<ApiKeyIdentity | undefined> {
    return identifyApiKeyHash(this.db, hashApiKey(key));
  }

  forget(): void {}
}

export interface CachedApiKeyIdentitiesOptions {
  readonly db: Queryable;
  /** Where the identity notifications come from (migration 15's triggers on `teams` and `api_keys`). */
  readonly databaseUrl: string;
  readonly schema: string;
  /** The longest an identity is kept (WARREN_API_KEY_CACHE_MS): a bound, should a notification ever go astray. */
  readonly ttlMs: number;
  /** The most keys kept; past it the oldest is dropped. */
  readonly maxEntries?: number;
  readonly onError?: (error: Error) => void;
  /** How long after a failure the listening connection is made again (default 1 s). */
  readonly listenRetryMs?: number;
  readonly now?: () => number;
}

/**
 * Known keys' identities kept in memory, so a request costs no PostgreSQL round trip for its key (~1 ms here, on
 * every API call). Correct as long as this replica hears every change: PostgreSQL sends a notification when a
 * change to `teams` or `api_keys` commits (a revocation, a team's new limits), and the cache forgets everything on
 * it. Identities are kept only while the LISTEN connection is up (a notification sent while it is down is lost, so
 * the cache empties when it fails and fills again once it listens), and a lookup that a notification overtook is
 * not kept: it may have read the row before the change. Unknown keys are never kept (nothing to invalidate, and a
 * guesser gains nothing from a miss's round trip).
 */
export class CachedApiKeyIdentities implements ApiKeyIdentities {
  private readonly entries = new Map<string, { readonly identity: ApiKeyIdentity; readonly expiresAt: number }>();
  private readonly listener: Listener;
  private listening = false;
  /** Bumped by every notification and every change of `listening`: a lookup started before one is not kept. */
  private generation = 0;
  private readonly now: () => number;
  private readonly maxEntries: number;

  constructor(private readonly options: CachedApiKeyIdentitiesOptions) {
    this.now = options.now ?? Date.now;
    this.maxEntries = options.maxEntries ?? 10_000;
    this.listener = new Listener({
      url: options.databaseUrl,
      schema: options.schema,
      topic: "identity",
      ...(options.listenRetryMs === undefined ? {} : { retryMs: options.listenRetryMs }),
      onNotify: () => this.forget(),
      onListening: () => {
        this.forget();
        this.listening = true;
      },
      onError: (error) => {
        this.listening = false;
        this.forget();
        options.onError?.(error);
      },
    });
  }

  /** Starts listening; until LISTEN takes effect every lookup goes to PostgreSQL. */
  start(): this {
    this.listener.start();
    return this;
  }

  async stop(): Promise<void> {
    this.listening = false;
    this.forget();
    await this.listener.stop();
  }

  /** Identities kept now (for tests and metrics). */
  get size(): number {
    return this.entries.size;
  }

  async identify(key: string): Promise<ApiKeyIdentity | undefined> {
    const keyHash = hashApiKey(key);
    const kept = this.entries.get(keyHash);
    if (kept && this.listening) {
      if (kept.expiresAt > this.now()) return kept.identity;
      this.entries.delete(keyHash);
    }
    const generation = this.generation;
    const identity = await identifyApiKeyHash(this.options.db, keyHash);
    if (identity && this.listening && generation === this.generation) {
      this.entries.delete(keyHash);
      this.entries.set(keyHash, { identity, expiresAt: this.now() + this.options.ttlMs });
      // A Map iterates in insertion order: the first key is the one kept longest.
      if (this.entries.size > this.maxEntries) this.entries.delete(this.entries.keys().next().value as string);
    }
    return identity;
  }

  forget(): void {
    this.generation += 1;
    this.entries.clear();
  }
}
