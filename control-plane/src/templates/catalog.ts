import type { SandboxResources } from "../runtime/driver.js";

/**
 * Templates this node can build, as recipes. A recipe's content (and its parent's hash) is its identity: change
 * a package or a step and the template gets a new hash, so the cache never serves a stale build.
 */
export interface TemplateRecipe {
  readonly id: string;
  /** Built on top of this template's rootfs; absent for a debootstrap base. */
  readonly parent?: string;
  /** Debian minbase + these packages. */
  readonly debootstrap?: { readonly suite: string; readonly include: readonly string[] };
  /** Shell steps run as root in the rootfs (chroot, network allowed), in order. */
  readonly steps: readonly { readonly name: string; readonly run: string }[];
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

/** Everything after debootstrap for the E2B-compatible base: `user` with passwordless sudo, mount points. */
const BASE_SETUP = `set -e
useradd --create-home --uid 1000 --shell /bin/bash user
echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' > /etc/sudoers.d/user
chmod 0440 /etc/sudoers.d/user
echo sandbox > /etc/hostname
printf '127.0.0.1\\tlocalhost sandbox\\n::1\\tlocalhost ip6-localhost ip6-loopback\\n' > /etc/hosts
: > /etc/resolv.conf
mkdir -p /opt/warren/envd /opt/warren/proto /opt/warren/node_modules /opt/warren/bin /usr/local/bin
: > /opt/warren/bin/node
: > /usr/local/bin/node
chmod 0755 /opt/warren/bin/node /usr/local/bin/node
${LOGIN_SHELL_SETUP}`;

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

const CLEAN_APT = "apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb";

export const TEMPLATE_RECIPES: Readonly<Record<string, TemplateRecipe>> = {
  base: {
    id: "base",
    debootstrap: { suite: "bookworm", include: BASE_PACKAGES },
    steps: [
      { name: "user and sudo", run: BASE_SETUP },
      { name: "clean apt cache", run: CLEAN_APT },
    ],
    defaults: { cpuCount: 1, memoryMB: 512, diskSizeMB: 1024, pidsMax: 1024 },
    allowSetuid: true,
  },
  "code-interpreter-v1": {
    id: "code-interpreter-v1",
    parent: "base",
    steps: [
      {
        name: "jupyter stack",
        run: `set -e
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ${JUPYTER_PACKAGES.join(" ")}
${CLEAN_APT}`,
      },
      {
        // R (Debian's IRkernel) and Java (a JDK: the gateway's jshell kernel); their kernels start on first use.
        name: "r and java kernels",
        run: `set -e
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ${R_JAVA_PACKAGES.join(" ")}
${CLEAN_APT}`,
      },
      {
        // Mount points of the host's code gateway (bound read-only by the driver, like envd).
        name: "code gateway mount points",
        run: CODE_GATEWAY_MOUNT_POINTS,
      },
    ],
    defaults: { cpuCount: 2, memoryMB: 1024, diskSizeMB: 2048, pidsMax: 2048 },
    allowSetuid: true,
    codeGateway: true,
  },
  // Under the layers of templates built from OCI images (the image is the lowest layer).
  scratch: {
    id: "scratch",
    steps: [],
    defaults: { cpuCount: 2, memoryMB: 1024, diskSizeMB: 2048, pidsMax: 2048 },
    allowSetuid: true,
    empty: true,
  },
  // `base` in a microVM of its own, never on a namespace node.
  "base-vm": {
    id: "base-vm",
    parent: "base",
    steps: [],
    defaults: { cpuCount: 1, memoryMB: 512, diskSizeMB: 1024, pidsMax: 1024 },
    allowSetuid: true,
    requiresDriver: "microvm",
  },
};
