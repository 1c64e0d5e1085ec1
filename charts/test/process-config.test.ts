/**
 * The chart against the processes it deploys: each process's own config loader (imported from its source) is run
 * on the environment the chart renders for it. Every variable a loader reads must be settable from values, every
 * variable the chart sets must be one a process reads, the loaders must accept what the chart renders, and the
 * ports, entry points and addresses in the manifests must be the ones the processes really use.
 */
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { parse } from "yaml";
import { loadApiConfig } from "../../control-plane/src/api/config.js";
import { loadMasterConfig } from "../../control-plane/src/master/config.js";
import { loadNodeAgentConfig } from "../../control-plane/src/node-agent/config.js";
import { loadConfig as loadProxyConfig } from "../../proxy/src/config.js";
import { CHART_DIR, CHARTS_DIR, ensureHelm } from "./helm.js";
import {
  componentContainer,
  containerEnv,
  get,
  type Manifest,
  PROFILES,
  profileName,
  profileValues,
  RELEASE,
  render,
  workloads,
} from "./manifests.js";

const REPO = dirname(CHARTS_DIR);
type Env = Record<string, string | undefined>;

interface Component {
  readonly name: string;
  /** The loader, as the process's main.ts calls it. */
  readonly load: (env: Env) => Record<string, unknown>;
  /** config.ts files whose variable names must all be covered. */
  readonly sources: readonly string[];
  /** What the process needs to start at all (the chart always provides it). */
  readonly required: Env;
  /** Config fields that may load the same as the default, and why. */
  readonly mayStayDefault?: readonly string[];
}

const COMPONENTS: readonly Component[] = [
  {
    name: "api",
    load: (env) => ({ ...loadApiConfig(env) }),
    sources: ["control-plane/src/api/config.ts"],
    required: {},
  },
  {
    name: "master",
    load: (env) => ({ ...loadMasterConfig(env) }),
    sources: ["control-plane/src/master/config.ts"],
    required: { WARREN_TOKEN_SECRET: "a-token-secret-of-32-characters!" },
  },
  {
    name: "proxy",
    load: (env) => ({ ...loadProxyConfig(env, 4) }),
    sources: ["proxy/src/config.ts"],
    required: {},
  },
  {
    name: "node-agent",
    load: (env) => ({ ...loadNodeAgentConfig(env) }),
    sources: ["control-plane/src/node-agent/config.ts"],
    required: {},
    // WARREN_CRIU=off and an absent CRIU both load as undefined on a host without the CRIU wrapper.
    mayStayDefault: ["criu"],
  },
];

/**
 * Variables the chart sets that no Warren config.ts reads, each for a reason: PGPASSWORD is read by the pg driver
 * (the in-cluster DATABASE_URL carries no password); REDIS_PASSWORD and HOST_IP are expanded by the kubelet into
 * the Redis URLs and the node agent's addresses.
 */
const CHART_ONLY = new Set(["PGPASSWORD", "REDIS_PASSWORD", "HOST_IP"]);

/** Runs a loader on an env that records which variables it reads. */
function variablesRead(component: Component, env: Env): Set<string> {
  const read = new Set<string>();
  const recording = new Proxy(env, {
    get(target, key) {
      if (typeof key === "string") read.add(key);
      return target[key as string];
    },
  });
  component.load(recording);
  return read;
}

/** Variable names a config.ts mentions in code (comments stripped): env.NAME, env["NAME"], "NAME" arguments. */
function variablesInSource(file: string): Set<string> {
  const code = readFileSync(join(REPO, file), "utf8")
    .replace(/\/\*[\s\S]*?\*\//g, "")
    .replace(/\/\/.*$/gm, "");
  const names = new Set<string>();
  for (const match of code.matchAll(/env\.([A-Z][A-Z0-9_]*)|["'`]([A-Z][A-Z0-9]*_[A-Z0-9_]+)["'`]/g)) {
    names.add((match[1] ?? match[2]) as string);
  }
  return names;
}

const EVERY_SETTING = "ci/every-setting-values.yaml";
const rendered = new Map<string | undefined, Manifest[]>();

beforeAll(async () => {
  await ensureHelm();
  for (const profile of PROFILES) rendered.set(profile, await render(profile));
}, 600_000);

function manifestsOf(profile: string | undefined): Manifest[] {
  const manifests = rendered.get(profile);
  if (!manifests) throw new Error(`${profileName(profile)} was not rendered`);
  return manifests;
}

function hasComponent(manifests: Manifest[], component: string): boolean {
  return workloads(manifests).some((w) => w.spec.template.metadata.labels["app.kubernetes.io/component"] === component);
}

function containerPort(container: Manifest, name: string): number | undefined {
  return container.ports?.find((p: Manifest) => p.name === name)?.containerPort;
}

describe.each(COMPONENTS.map((c) => [c.name, c]))("%s configuration", (_name, component) => {
  it("every variable its config.ts reads is rendered by the chart (all set in the every-setting profile)", () => {
    const manifests = manifestsOf(EVERY_SETTING);
    const env = containerEnv(manifests, componentContainer(manifests, component.name));
    const needed = new Set([
      ...variablesRead(component, env),
      ...component.sources.flatMap((file) => [...variablesInSource(file)]),
    ]);
    expect(needed.size).toBeGreaterThan(3);
    expect([...needed].filter((name) => !(name in env)).sort()).toEqual([]);
  });

  it("every setting in the every-setting profile changes the loaded configuration from its default", () => {
    const manifests = manifestsOf(EVERY_SETTING);
    const configured = component.load(containerEnv(manifests, componentContainer(manifests, component.name)));
    const defaults = component.load(component.required);
    const unchanged = Object.keys(defaults).filter(
      (key) =>
        JSON.stringify(configured[key]) === JSON.stringify(defaults[key]) && !component.mayStayDefault?.includes(key),
    );
    expect(unchanged).toEqual([]);
  });

  it.each(PROFILES.map((p) => [profileName(p), p]))("with %s: sets only variables a process reads", (_p, profile) => {
    const manifests = manifestsOf(profile);
    if (!hasComponent(manifests, component.name)) return;
    const env = containerEnv(manifests, componentContainer(manifests, component.name));
    const read = new Set([
      ...variablesRead(component, env),
      ...component.sources.flatMap((file) => [...variablesInSource(file)]),
    ]);
    expect(Object.keys(env).filter((name) => !read.has(name) && !CHART_ONLY.has(name))).toEqual([]);
  });

  it.each(PROFILES.map((p) => [profileName(p), p]))("with %s: the process accepts what is rendered", (_p, profile) => {
    const manifests = manifestsOf(profile);
    if (!hasComponent(manifests, component.name)) return;
    const env = containerEnv(manifests, componentContainer(manifests, component.name));
    expect(() => component.load(env)).not.toThrow();
    for (const [name, value] of Object.entries(env)) expect(value, name).not.toMatch(/\$\(/);
  });

  it("runs the process's real entry point from the image's working directory", () => {
    const manifests = manifestsOf(undefined);
    const container = componentContainer(manifests, component.name);
    const [binary, script] = container.command;
    expect(binary).toBe("node");
    const source = String(script)
      .replace(/^([^/]+)\/dist\//, "$1/src/")
      .replace(/\.js$/, ".ts");
    expect(existsSync(join(REPO, source)), `${script} is built from ${source}`).toBe(true);
    expect(readFileSync(join(REPO, source), "utf8")).toMatch(
      /loadConfig|loadApiConfig|loadMasterConfig|loadNodeAgentConfig/,
    );
    const values = parse(readFileSync(join(CHART_DIR, "values.yaml"), "utf8"));
    expect(container.workingDir).toBe(values.image.workdir);
  });
});

describe.each(PROFILES.map((p) => [profileName(p), p]))("manifests against the loaded configs, %s", (_p, profile) => {
  function load(component: string): { config: Record<string, unknown>; container: Manifest; env: Env } {
    const manifests = manifestsOf(profile);
    const container = componentContainer(manifests, component);
    const env = containerEnv(manifests, container);
    const loader = COMPONENTS.find((c) => c.name === component) as Component;
    return { config: loader.load(env), container, env };
  }

  it("declares the ports the processes listen on", () => {
    const manifests = manifestsOf(profile);
    const api = load("api");
    expect(containerPort(api.container, "http")).toBe(api.config.port);
    const master = load("master");
    expect(containerPort(master.container, "connect")).toBe(master.config.port);
    const proxy = load("proxy");
    expect(containerPort(proxy.container, "http")).toBe(proxy.config.port);
    expect(containerPort(proxy.container, "metrics")).toBe(proxy.config.metricsPort);
    if (hasComponent(manifests, "node-agent")) {
      const agent = load("node-agent");
      expect(containerPort(agent.container, "connect")).toBe(agent.config.listenPort);
    }
  });

  it("points the api at the master's Service and port", () => {
    const manifests = manifestsOf(profile);
    const url = new URL(String(load("api").config.masterUrl));
    const service = manifests.find((m) => m.kind === "Service" && m.metadata.name === url.hostname);
    if (!service) {
      expect(profile, `masterUrl ${url} names no Service: only a profile that overrides it may`).toBe(EVERY_SETTING);
      return;
    }
    expect(service.metadata.labels["app.kubernetes.io/component"]).toBe("master");
    const port = service.spec.ports.find((p: Manifest) => p.port === Number(url.port));
    expect(port?.targetPort).toBe("connect");
  });

  it("gives the master, the proxies and the node agents the same Redis, and api and master the same database", () => {
    const manifests = manifestsOf(profile);
    const redis = new Set([load("master").config.redisUrl, load("proxy").config.redisUrl]);
    if (hasComponent(manifests, "node-agent")) redis.add(load("node-agent").config.redisUrl);
    expect(redis.size).toBe(1);
    expect(load("api").config.databaseUrl).toBe(load("master").config.databaseUrl);
    expect(load("api").config.schema).toBe(load("master").config.schema);
  });

  it("hands clients the chart's domain and routes sandbox hosts under it", () => {
    const values = profileValues(profile);
    expect(load("master").config.domain).toBe(values.domain);
    if (values.domain) expect(load("proxy").config.domains).toContain(values.domain);
  });

  it("mounts the files and directories the configs name", () => {
    const manifests = manifestsOf(profile);
    const proxy = load("proxy");
    const tls = proxy.config.tls as { certFile: string; keyFile: string } | undefined;
    if (tls) {
      const mounts = proxy.container.volumeMounts.map((m: Manifest) => m.mountPath);
      expect(mounts).toContain(dirname(tls.certFile));
      expect(mounts).toContain(dirname(tls.keyFile));
    }
    if (!hasComponent(manifests, "node-agent")) return;
    const agent = load("node-agent");
    const daemonSet = get(manifests, "DaemonSet", `${RELEASE}-warren-node-agent`);
    const hostPaths = new Map<string, string>(
      daemonSet.spec.template.spec.volumes
        .filter((v: Manifest) => v.hostPath)
        .map((v: Manifest) => [v.name, v.hostPath.path]),
    );
    for (const dir of [agent.config.stateDir, agent.config.templatesDir] as string[]) {
      const mount = agent.container.volumeMounts.find(
        (m: Manifest) => dir === m.mountPath || dir.startsWith(`${m.mountPath}/`),
      );
      expect(mount, `${dir} is on a host path`).toBeDefined();
      expect(hostPaths.get(mount.name), dir).toBe(mount.mountPath);
      expect(mount.mountPropagation, dir).toBe("Bidirectional");
    }
    expect(agent.config.envdRoot).toBe(agent.container.workingDir);
  });
});

describe("the image", () => {
  it("is one image for every Warren process, tagged with the chart's appVersion by default", () => {
    const manifests = manifestsOf(undefined);
    const images = new Set(["api", "master", "proxy", "node-agent"].map((c) => componentContainer(manifests, c).image));
    const chart = parse(readFileSync(join(CHART_DIR, "Chart.yaml"), "utf8"));
    expect([...images]).toEqual([`warren:${chart.appVersion}`]);
    const controlPlane = JSON.parse(readFileSync(join(REPO, "control-plane/package.json"), "utf8"));
    expect(chart.appVersion).toBe(controlPlane.version);
  });

  it("is described by a Dockerfile whose WORKDIR is the chart's image.workdir and that has the node agent's tools", () => {
    const dockerfile = readFileSync(join(CHART_DIR, "Dockerfile"), "utf8");
    const values = parse(readFileSync(join(CHART_DIR, "values.yaml"), "utf8"));
    expect(dockerfile).toMatch(new RegExp(`^WORKDIR ${values.image.workdir}$`, "m"));
    expect(dockerfile).toMatch(/^FROM node:20-bookworm/m);
    for (const pkg of ["crun", "tini", "debootstrap", "iproute2", "iptables"]) {
      expect(readFileSync(join(REPO, "scripts/setup-host.sh"), "utf8")).toContain(pkg);
      expect(dockerfile).toMatch(new RegExp(`\\b${pkg}\\b`));
    }
  });

  it("NOTES.txt names the admin endpoint, the admin CLI that exists, and the SDK's variables", () => {
    const notes = readFileSync(join(CHART_DIR, "templates/NOTES.txt"), "utf8");
    expect(notes).toContain("/warren/v1/admin/teams");
    expect(notes).toContain("X-Admin-Token");
    const cli = /node (control-plane\/dist\/api\/admin-cli\.js) create-team/.exec(notes)?.[1];
    expect(cli).toBeDefined();
    expect(existsSync(join(REPO, String(cli).replace("/dist/", "/src/").replace(/\.js$/, ".ts")))).toBe(true);
    for (const name of ["E2B_API_URL", "E2B_DOMAIN", "E2B_SANDBOX_URL", "E2B_API_KEY"]) expect(notes).toContain(name);
  });
});
