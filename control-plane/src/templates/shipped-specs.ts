// What the shipped templates are made of: Debian packages and a few build steps, as specs for the template builder.

/** `base`'s Debian packages (E2B's base image has these tools). */
export const BASE_PACKAGES = [
  "bash",
  "coreutils",
  "python3",
  "git",
  "curl",
  "ca-certificates",
  "sudo",
  "inotify-tools",
  "util-linux",
  "procps",
  "tini",
  // E2B's ready helpers (waitForPort) run `ss`; E2B's base answers `python`.
  "iproute2",
  "python-is-python3",
];

/** Login shells that start no process of their own (the why is in the text: it is also a build step). */
export const LOGIN_SHELL_SETUP = `# Every E2B command is \`bash -l -c\`, and Debian's /etc/profile asks \`$(id -u)\` whether it runs as root: a
# subshell fork and an exec of id, half of a login shell's start here (bash -l -c true 10.5 → 5.2 ms). Bash knows
# its EUID; sh (no EUID) still asks id. root's ~/.profile runs \`mesg n\`, which only means something on a
# terminal (elsewhere it fails, silenced): only there now.
sed -i 's/"$(id -u)"/"\${EUID:-$(id -u)}"/' /etc/profile
grep -q 'EUID:-' /etc/profile
sed -i 's#^mesg n 2> /dev/null || true$#if [ -t 0 ]; then mesg n 2> /dev/null || true; fi#' /root/.profile
grep -qF 'if [ -t 0 ]; then mesg n' /root/.profile
`;

/** The Jupyter stack of `code-interpreter-v1` (Python kernels, the libraries E2B's code interpreter has). */
export const JUPYTER_PACKAGES = [
  "python3-ipykernel",
  "python3-jupyter-client",
  "python3-matplotlib",
  "python3-matplotlib-inline",
  "python3-pandas",
  "python3-numpy",
  "python3-pexpect",
];

/** R (Debian's IRkernel) and Java (a JDK: the gateway's jshell kernel); their kernels start on first use. */
export const R_JAVA_PACKAGES = ["r-base-core", "r-cran-irkernel", "openjdk-17-jdk-headless"];

/** Mount points of the host's code gateway (bound read-only by the driver, like envd). */
export const CODE_GATEWAY_MOUNT_POINTS =
  "set -e\nmkdir -p /opt/warren/code-gateway/dist /opt/warren/code-gateway/python\n: > /opt/warren/code-gateway/package.json\n";

/**
 * A shipped template as the template builder's stored spec (store/template-spec.ts, `parseStoredBuildSpec`): a
 * Debian base the node makes (its packages installed by debootstrap outside any sandbox, so the steps need no
 * network) and E2B's RUN steps as root in a build sandbox. `user` with passwordless sudo, the hostname, /etc/hosts
 * and envd's mount points come from the base's preparation (oci/prepare.ts), as for any image.
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
