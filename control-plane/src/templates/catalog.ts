import type { SandboxResources } from "../runtime/driver.js";

/**
 * The templates a node serves without a team's build: their resources and flags, and how the node gets their root
 * filesystem. `base` and `code-interpreter-v1` are made by the master's template builder from their specs
 * (shipped-specs.ts), like any team's template; `scratch` is empty and `base-vm` is a copy of `base`. A recipe's
 * content (with its spec and its parent's hash) is its identity: change a package and the template gets a new hash,
 * so the cache never serves a stale build.
 */
export interface TemplateRecipe {
  readonly id: string;
  /** A copy of this template's rootfs (no spec of its own). */
  readonly parent?: string;
  readonly defaults: SandboxResources;
  /** Needs setuid (sudo): no-new-privileges stays off for its sandboxes. */
  readonly allowSetuid: boolean;
  /** Its sandboxes run the code gateway (`runCode`, port 49999) next to envd. */
  readonly codeGateway?: boolean;
  /**
   * An empty root: nothing runs from it alone. Sandboxes start from snapshots stacked on it (an OCI image's
   * prepared rootfs as their bottom layer: custom templates `fromImage`), so it has no ready check.
   */
  readonly empty?: boolean;
  /**
   * Its sandboxes run only on nodes with this kind of driver: `microvm` = their own kernel (the `microvm` driver, or
   * `microvm-tcg` in tests), for code that must not share the host's kernel. Absent: any driver.
   */
  readonly requiresDriver?: "microvm";
}

/** Whether a node whose runtime driver is `driverName` may run sandboxes of `recipe`. */
export function driverServes(recipe: TemplateRecipe, driverName: string): boolean {
  if (!recipe.requiresDriver) return true;
  return driverName === recipe.requiresDriver || driverName.startsWith(`${recipe.requiresDriver}-`);
}

export const TEMPLATE_RECIPES: Readonly<Record<string, TemplateRecipe>> = {
  // Made by the template builder from their specs (shipped-specs.ts).
  base: {
    id: "base",
    defaults: { cpuCount: 1, memoryMB: 512, diskSizeMB: 1024, pidsMax: 1024 },
    allowSetuid: true,
  },
  "code-interpreter-v1": {
    id: "code-interpreter-v1",
    defaults: { cpuCount: 2, memoryMB: 1024, diskSizeMB: 2048, pidsMax: 2048 },
    allowSetuid: true,
    codeGateway: true,
  },
  // Under the layers of templates built from OCI images (the image is the lowest layer).
  scratch: {
    id: "scratch",
    defaults: { cpuCount: 2, memoryMB: 1024, diskSizeMB: 2048, pidsMax: 2048 },
    allowSetuid: true,
    empty: true,
  },
  // `base` in a microVM of its own, never on a namespace node.
  "base-vm": {
    id: "base-vm",
    parent: "base",
    defaults: { cpuCount: 1, memoryMB: 512, diskSizeMB: 1024, pidsMax: 1024 },
    allowSetuid: true,
    requiresDriver: "microvm",
  },
};
