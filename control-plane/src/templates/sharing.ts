import type { RootfsDiff } from "./rootfs-diff.js";

/**
 * How the nodes of a cluster share the shipped templates (the recipes of catalog.ts) so that every node runs the
 * same bytes: one node has a template made (by the master's template builder), publishes its root filesystem to the
 * cluster's template store, and every other node pulls it (its digest checked) instead of having its own made.
 * Without this, each node's `base` is debootstrapped at its own moment and gets the Debian packages of that moment, and a custom template's layers built on one node's `base`
 * would be stacked on another node's different `base`. The store and the claim live in the node agent
 * (node-agent/shipped-templates.ts); store.ts only asks through this seam.
 */
export interface SharedTemplates {
  /** Where templates are shared (for logs; never credentials). */
  readonly description: string;
  /** Whether the store holds the template named `name` (`<id>-<content key>`). */
  has(name: string): Promise<boolean>;
  /** The digest the store's copy of `name` was published with; undefined when the store lacks it. */
  digest(name: string): Promise<string | undefined>;
  /**
   * Unpacks the published copy into `rootfs`, checking its bytes against the digest it was published with;
   * undefined when the store does not hold it. Owners are as the publisher had them (its `uidBase`): the caller
   * moves them into its own range. A copy published as a difference over its parent holds only what the child
   * changed: `overParent` is called first and must make `rootfs` that parent (its deletions done), the difference
   * is then unpacked over it. Without `overParent` such a copy is refused.
   */
  fetch(
    name: string,
    rootfs: string,
    overParent?: (parent: ParentOfLayer) => Promise<void>,
  ): Promise<FetchedTemplate | undefined>;
  /**
   * Makes this node the one that builds `name` for the cluster until the claim is released; undefined while
   * another node holds it (`holder` then names it).
   */
  claim(name: string): Promise<TemplateBuildClaim | { readonly holder: string }>;
  /**
   * Removes the store's copies of template `id` other than `current` once `current` has been in the store for
   * `graceMs` (nodes still running the previous recipe during an upgrade keep pulling theirs until then); resolves
   * with the names removed.
   */
  collect(id: string, current: string, graceMs: number): Promise<string[]>;
}

export interface FetchedTemplate {
  readonly digest: string;
  readonly bytes: number;
  /** The uid base the publisher's owners are in. */
  readonly uidBase: number;
  /** Set when the copy is a difference over its parent's. */
  readonly layeredOn?: ParentOfLayer;
}

/** The parent copy a layered copy goes over: its name and digest in the store, and what to delete from it. */
export interface ParentOfLayer {
  readonly name: string;
  readonly digest: string;
  readonly deletions: readonly string[];
  /** The uid base of the layer's owners (the publisher's). */
  readonly uidBase: number;
}

/** A child template published as what its build changed over its parent's published copy (rootfs-diff.ts). */
export interface LayeredPublish {
  readonly parent: { readonly name: string; readonly digest: string };
  readonly diff: RootfsDiff;
}

export interface TemplateBuildClaim {
  /**
   * Publishes `rootfs` (owners in `uidBase`'s range) under the claimed name, whole or, with `layered`, only its
   * difference over the parent; resolves with its digest and size.
   */
  publish(
    rootfs: string,
    uidBase: number,
    layered?: LayeredPublish,
  ): Promise<{ readonly digest: string; readonly bytes: number }>;
  /** Gives the claim up (idempotent); a claim is kept alive until then. */
  release(): Promise<void>;
}

export function isClaim(value: TemplateBuildClaim | { readonly holder: string }): value is TemplateBuildClaim {
  return "publish" in value;
}
