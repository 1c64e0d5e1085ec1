import { existsSync, readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import type { ConnectionOpts } from "../config.js";

/** The Warren checkout this CLI was built in: `sdk/dist/cli/config.js` → three levels up. */
export const WARREN_HOME = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

/** Options every command accepts (commander's `optsWithGlobals()`). */
export interface GlobalFlags {
  apiUrl?: string;
  apiKey?: string;
  sandboxUrl?: string;
  adminToken?: string;
  dataDir?: string;
  json?: boolean;
}

/**
 * The one resolved configuration of a CLI run. Each setting comes from its flag, else the environment
 * (`WARREN_*`, then `E2B_*`), else the `env` file `warren up` wrote into the data dir.
 */
export interface CliConfig {
  readonly dataDir: string;
  readonly envFile: string;
  readonly json: boolean;
  readonly apiUrl: string | undefined;
  readonly apiKey: string | undefined;
  readonly sandboxUrl: string | undefined;
  readonly adminToken: string | undefined;
}

/** `KEY=value` lines (the format of `.warren/env`); blank lines and `#` comments are skipped. */
export function parseEnvFile(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) continue;
    const at = line.indexOf("=");
    if (at <= 0) continue;
    out[line.slice(0, at).replace(/^export\s+/, "")] = line.slice(at + 1);
  }
  return out;
}

/** The data dir: `--data-dir`, `WARREN_DATA_DIR`, the nearest `.warren` above the working dir, else the checkout's. */
export function dataDirOf(flag: string | undefined, env: NodeJS.ProcessEnv, cwd: string): string {
  if (flag) return resolve(flag);
  if (env.WARREN_DATA_DIR) return resolve(env.WARREN_DATA_DIR);
  for (let dir = resolve(cwd); ; dir = dirname(dir)) {
    if (existsSync(join(dir, ".warren", "env"))) return join(dir, ".warren");
    if (dirname(dir) === dir) break;
  }
  return join(WARREN_HOME, ".warren");
}

export function resolveConfig(
  flags: GlobalFlags,
  env: NodeJS.ProcessEnv = process.env,
  cwd = process.cwd(),
): CliConfig {
  const dataDir = dataDirOf(flags.dataDir, env, cwd);
  const envFile = join(dataDir, "env");
  const file = existsSync(envFile) ? parseEnvFile(readFileSync(envFile, "utf8")) : {};
  const pick = (flag: string | undefined, ...names: string[]): string | undefined => {
    if (flag) return flag;
    for (const source of [env, file]) {
      for (const name of names) {
        const value = source[name];
        if (value) return value;
      }
    }
    return undefined;
  };
  return {
    dataDir,
    envFile,
    json: flags.json ?? false,
    apiUrl: pick(flags.apiUrl, "WARREN_API_URL", "E2B_API_URL"),
    apiKey: pick(flags.apiKey, "WARREN_API_KEY", "E2B_API_KEY"),
    sandboxUrl: pick(flags.sandboxUrl, "WARREN_SANDBOX_URL", "E2B_SANDBOX_URL", "WARREN_PROXY_URL"),
    adminToken: pick(flags.adminToken, "WARREN_ADMIN_TOKEN"),
  };
}

/** SDK connection options from the resolved config (what is unset falls through to the SDK's own defaults). */
export function connectionOpts(config: CliConfig): ConnectionOpts {
  return {
    ...(config.apiUrl ? { apiUrl: config.apiUrl } : {}),
    ...(config.apiKey ? { apiKey: config.apiKey } : {}),
    ...(config.sandboxUrl ? { sandboxUrl: config.sandboxUrl } : {}),
  };
}
