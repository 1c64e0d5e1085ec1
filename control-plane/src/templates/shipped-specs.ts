import {
  BASE_PACKAGES,
  CODE_GATEWAY_MOUNT_POINTS,
  JUPYTER_PACKAGES,
  LOGIN_SHELL_SETUP,
  R_JAVA_PACKAGES,
} from "./catalog.js";

/**
 * A shipped template as the template builder's stored spec (store/template-spec.ts, `parseStoredBuildSpec`): a
 * Debian base the node makes (its packages installed by debootstrap outside any sandbox, so the steps need no
 * network) and E2B's RUN steps as root in a build sandbox. What the recipe's chroot steps did for `user`, sudo,
 * /etc/hosts and the mount points, the base's preparation does (oci/prepare.ts, as for any image).
 */
export interface ShippedBuildSpec {
  readonly fromDebian: {
    readonly suite: string;
    readonly packages: readonly string[];
    readonly aptPackages?: readonly string[];
  };
  readonly force: false;
  readonly startCmd: null;
  readonly readyCmd: null;
  readonly steps: readonly { readonly type: "RUN"; readonly args: readonly [string, "root"]; readonly force: false }[];
}

function spec(packages: readonly string[], aptPackages: readonly string[], ...scripts: string[]): ShippedBuildSpec {
  return {
    fromDebian: { suite: "bookworm", packages, ...(aptPackages.length > 0 ? { aptPackages } : {}) },
    force: false,
    startCmd: null,
    readyCmd: null,
    steps: scripts.map((script) => ({
      type: "RUN",
      args: [script.startsWith("set -e\n") ? script : `set -e\n${script}`, "root"],
      force: false,
    })),
  };
}

/**
 * `base` and `code-interpreter-v1` as the builder builds them (e2e/test/template-debian.test.ts builds `base`'s
 * and checks a sandbox of it against what sandboxes of the shipped `base` are). `code-interpreter-v1` is its own
 * Debian base, `base`'s packages by debootstrap and its own by apt, not `base` plus a step installing them: build
 * steps have no internet.
 */
export const SHIPPED_BUILD_SPECS: Readonly<Record<"base" | "code-interpreter-v1", ShippedBuildSpec>> = {
  base: spec(BASE_PACKAGES, [], LOGIN_SHELL_SETUP),
  "code-interpreter-v1": spec(
    BASE_PACKAGES,
    [...JUPYTER_PACKAGES, ...R_JAVA_PACKAGES],
    LOGIN_SHELL_SETUP,
    CODE_GATEWAY_MOUNT_POINTS,
  ),
};
