import { randomBytes } from "node:crypto";
import type { Db } from "../../store/db.js";
import { reservedMemoryByNode } from "../../store/nodes.js";
import { insertSnapshot, teamNamespace } from "../../store/snapshots.js";
import type { Team } from "../../store/teams.js";
import { findLayer, putLayer } from "../../store/template-layers.js";
import { findTemplateByRef, readyBuildOf } from "../../store/template-refs.js";
import type { TemplateBuildSpec } from "../../store/template-spec.js";
import { addBuildLayerKey, type BuildContext, type BuildRecord } from "../../store/templates.js";
import { DebianSourceError, normalizeDebianSource } from "../../templates/debian-rootfs.js";
import type { ImageSource, ImportedImage, NodeAgentConnector } from "../node-agent-client.js";
import type { NodeRegistry } from "../node-registry.js";
import { rankNodes } from "../placement.js";
import type { BuildLog } from "./build-log.js";
import { hashKeys } from "./build-steps.js";
import { PhaseError } from "./phase-error.js";
import type { RegistryLogin, TemplateBuildConfig } from "./template-builder.js";

/** Where a build starts: a node template (shipped, or an image prepared on a node) or a parent build's layer. */
export interface BuildBase {
  readonly nodeTemplateId: string;
  readonly key: string;
  readonly description: string;
  readonly snapshot?: { readonly id: string; readonly nodeId: string };
  readonly context: BuildContext;
  readonly startCmd: string | null;
  readonly readyCmd: string | null;
  /** Every part of the build runs on this node (the spec's `onNode`). */
  readonly onNode?: string;
}

export interface BuildBaseDeps {
  readonly db: Db;
  readonly registry: NodeRegistry;
  readonly nodeAgent: NodeAgentConnector;
  readonly config: TemplateBuildConfig;
  readonly memoryOvercommit: number;
  /** Whether a cached layer can still be used (a live node holds it, or the store has it). */
  readonly reachable: (snapshotId: string) => Promise<boolean>;
}

export interface BuildBaseRequest {
  readonly team: Team;
  readonly spec: TemplateBuildSpec;
  readonly build: BuildRecord;
  readonly credentials: RegistryLogin | undefined;
  readonly buildLog: BuildLog;
}

const DEFAULT_CONTEXT: BuildContext = { user: "user", workdir: null, env: {} };
/** Matches E2B's default base image, which is Warren's `base` template. */
const E2B_BASE_IMAGE = /^(?:(?:docker\.io|index\.docker\.io)\/)?e2bdev\/base(?::[\w.-]+)?$/;

/**
 * Where a build starts (E2B's base phase): a parent template (Warren's shipped ones by their node template, a team's
 * by its ready build's layer and context), E2B's default base image (Warren's `base`), or any other OCI image.
 */
export async function resolveBuildBase(deps: BuildBaseDeps, request: BuildBaseRequest): Promise<BuildBase> {
  const base = await resolveBase(deps, request);
  return request.spec.onNode ? { ...base, onNode: request.spec.onNode } : base;
}

async function resolveBase(deps: BuildBaseDeps, request: BuildBaseRequest): Promise<BuildBase> {
  const { team, spec } = request;
  if (spec.fromTemplate) {
    const resolved = await findTemplateByRef(
      deps.db,
      { id: team.id, namespace: teamNamespace(team.name) },
      spec.fromTemplate,
    );
    if (!resolved) throw new PhaseError("base", `template '${spec.fromTemplate}' not found`);
    const { template } = resolved;
    if (template.teamId === null) {
      return {
        nodeTemplateId: template.id,
        key: hashKeys("warren-v1", `template:${template.id}`),
        description: `FROM TEMPLATE ${spec.fromTemplate}`,
        context: DEFAULT_CONTEXT,
        startCmd: null,
        readyCmd: null,
      };
    }
    const parent = await readyBuildOf(deps.db, resolved);
    if (!parent) throw new PhaseError("base", `template '${spec.fromTemplate}' has no ready build`);
    return {
      nodeTemplateId: parent.baseTemplateId as string,
      key: hashKeys("warren-v1", `template:${parent.id}`),
      description: `FROM TEMPLATE ${spec.fromTemplate}`,
      ...(parent.layerSnapshotId ? { snapshot: { id: parent.layerSnapshotId, nodeId: parent.nodeId as string } } : {}),
      // E2B's default-user phase runs for child templates too: they start as `user`.
      context: { user: "user", workdir: parent.defaultWorkdir, env: parent.envVars },
      startCmd: parent.startCmd,
      readyCmd: parent.readyCmd,
    };
  }
  if (spec.fromDebian) {
    let from: ImportSource;
    try {
      from = debianSource(spec.fromDebian);
    } catch (error) {
      if (error instanceof DebianSourceError) throw new PhaseError("base", error.message);
      throw error;
    }
    return imageBase(deps, request, from);
  }
  const image = spec.fromImage ?? "";
  if (E2B_BASE_IMAGE.test(image)) {
    return {
      nodeTemplateId: "base",
      key: hashKeys("warren-v1", "template:base"),
      description: `FROM ${image}`,
      context: DEFAULT_CONTEXT,
      startCmd: null,
      readyCmd: null,
    };
  }
  return imageBase(deps, request, {
    source: { image, credentials: request.credentials },
    key: hashKeys("warren-v1", "image", image),
    description: `FROM ${image}`,
  });
}

/** Where an imported base comes from, its cache key and how the log names it. */
interface ImportSource {
  readonly source: ImageSource;
  readonly key: string;
  readonly description: string;
}

/** A Debian base: the same suite and sets of packages (in any order) are the same layer. Bad names throw. */
function debianSource(debian: NonNullable<TemplateBuildSpec["fromDebian"]>): ImportSource {
  const source = normalizeDebianSource(debian);
  const packages = source.packages;
  const apt = source.aptPackages ?? [];
  return {
    source: { debian: source },
    key: hashKeys("warren-v1", "debian", debian.suite, ...packages, ...(apt.length > 0 ? ["apt", ...apt] : [])),
    description: `FROM debian:${debian.suite} (debootstrap${packages.length ? ` + ${packages.length} packages` : ""}${apt.length ? `, apt + ${apt.length}` : ""})`,
  };
}

/**
 * An OCI image (or a Debian system) as the base: pulled or made by a node (ImportImage) into a files-only snapshot
 * over the empty `scratch` template, cached as the team's layer under E2B's base key (the reference as text: a
 * moved tag needs `force`). The context is E2B's after the default-user phase: `user`, no workdir, the image's
 * environment.
 */
async function imageBase(deps: BuildBaseDeps, request: BuildBaseRequest, from: ImportSource): Promise<BuildBase> {
  const { team, spec, build, buildLog } = request;
  const { db } = deps;
  const { key, description } = from;
  const cached = spec.force ? undefined : await findLayer(db, team.id, key);
  if (cached && (await deps.reachable(cached.snapshotId))) {
    buildLog.info(`CACHED [base] ${description}`, "base");
    await addBuildLayerKey(db, build.id, key);
    return {
      nodeTemplateId: "scratch",
      key,
      description,
      snapshot: { id: cached.snapshotId, nodeId: cached.nodeId },
      context: cached.context,
      startCmd: null,
      readyCmd: null,
    };
  }
  const [nodes, reserved] = await Promise.all([deps.registry.placeableNodes(), reservedMemoryByNode(db)]);
  const node = rankNodes(
    spec.onNode ? nodes.filter((n) => n.nodeId === spec.onNode) : nodes,
    reserved,
    { templateId: "scratch", memoryMB: build.memoryMB },
    { memoryOvercommit: deps.memoryOvercommit },
  )[0];
  if (!node) {
    throw new PhaseError(
      "base",
      spec.onNode ? `node ${spec.onNode} cannot take the build now` : "no node can pull an image now",
    );
  }
  const id = `l${randomBytes(10).toString("hex")}`;
  buildLog.info(
    `[base] ${"image" in from.source ? `pulling ${from.source.image}` : "making a Debian system"} on node ${node.nodeId}`,
    "base",
  );
  let imported: ImportedImage;
  try {
    imported = await deps.nodeAgent(node.nodeId, node.addr).importImage(id, from.source);
  } catch (error) {
    throw new PhaseError("base", (error as Error).message.replace(/^[A-Z][a-z]+: /, ""));
  }
  for (const line of imported.log) buildLog.info(`[base] ${line}`, "base");
  const context: BuildContext = { user: "user", workdir: null, env: imageEnv(imported.env) };
  await insertSnapshot(db, {
    id,
    teamId: team.id,
    name: null,
    kind: "layer",
    sourceSandboxId: build.buildSandboxId as string,
    nodeId: node.nodeId,
    templateId: imported.snapshot.templateId,
    driver: imported.snapshot.driver,
    memory: false,
    sizeBytes: imported.snapshot.sizeBytes,
    cpuCount: build.cpuCount,
    memoryMB: build.memoryMB,
    diskSizeMB: deps.config.sandboxDiskMB,
    envVars: { ...context.env },
    metadata: { image: imported.resolved, digest: imported.digest },
  });
  await putLayer(db, team.id, { key, snapshotId: id, nodeId: node.nodeId, context });
  await addBuildLayerKey(db, build.id, key);
  buildLog.info(`[base] ${description} (${imported.resolved}@${imported.digest}) [${key.slice(0, 12)}]`, "base");
  return {
    nodeTemplateId: "scratch",
    key,
    description,
    snapshot: { id, nodeId: node.nodeId },
    context,
    startCmd: null,
    readyCmd: null,
  };
}

/** An image config's `K=V` list as a map (a later duplicate wins, as in Docker). */
function imageEnv(env: readonly string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const entry of env) {
    const eq = entry.indexOf("=");
    if (eq > 0) out[entry.slice(0, eq)] = entry.slice(eq + 1);
  }
  return out;
}
