/**
 * Typed environment parsing shared by every Warren process: each process reads its env vars once, at start, into
 * one validated config object; these helpers give every component the same rules and the same messages.
 */
import { createLogger } from "./log.js";

export type Env = Readonly<Record<string, string | undefined>>;

/** A setting that is missing, malformed or out of range. Processes exit with code 2 and print the message. */
export class ConfigError extends Error {
  readonly code = "config_invalid";
  constructor(message: string) {
    super(message);
    this.name = "ConfigError";
  }
}

/** `text` (decimal digits, no exponent or spaces) as an integer in [min, max]; `name` is in the message. */
export function parseInteger(name: string, text: string, min: number, max: number): number {
  const value = Number(text);
  if (!/^-?\d+$/.test(text) || value < min || value > max) {
    throw new ConfigError(`${name} must be an integer in [${min}, ${max}], got '${text}'`);
  }
  return value;
}

/** env[name] as an integer in [min, max]; unset or empty gives `fallback`. */
export function integerFromEnv(env: Env, name: string, fallback: number, min: number, max: number): number {
  const text = env[name];
  return text === undefined || text === "" ? fallback : parseInteger(name, text, min, max);
}

const TRUE = ["1", "true", "yes", "on"];
const FALSE = ["0", "false", "no", "off"];

/** env[name] as a boolean (1/true/yes/on, 0/false/no/off, any case); unset or empty gives `fallback`. */
export function booleanFromEnv(env: Env, name: string, fallback: boolean): boolean {
  const text = env[name];
  if (text === undefined || text === "") return fallback;
  const lower = text.toLowerCase();
  if (TRUE.includes(lower)) return true;
  if (FALSE.includes(lower)) return false;
  throw new ConfigError(`${name} must be true or false, got '${text}'`);
}

/** A comma-separated list, trimmed, empty entries dropped. */
export function parseList(text: string | undefined): string[] {
  return (text ?? "")
    .split(",")
    .map((entry) => entry.trim())
    .filter((entry) => entry.length > 0);
}

/** A setting that several components read, under its one name, with the names components used before. */
export interface RenamedSetting {
  readonly name: string;
  readonly oldNames: readonly string[];
}

/** Redis holding routes, heartbeats and events: the master, the node agents and the proxies. */
export const REDIS_URL: RenamedSetting = { name: "WARREN_REDIS_URL", oldNames: ["REDIS_URL", "PROXY_REDIS_URL"] };
/** PostgreSQL: the api and the master. */
export const DATABASE_URL: RenamedSetting = { name: "WARREN_DATABASE_URL", oldNames: ["DATABASE_URL"] };
/** The token the proxies and node agents present to the api's internal routes. */
export const INTERNAL_TOKEN: RenamedSetting = { name: "WARREN_INTERNAL_TOKEN", oldNames: ["PROXY_RESUME_TOKEN"] };

/**
 * A renamed setting's value: its one name (`WARREN_*`) wins; a name used before is still read for one release,
 * with a warning naming the new one. Old names are read only when the new one is unset.
 */
export function renamedEnv(env: Env, setting: RenamedSetting, warn: (message: string) => void): string | undefined {
  const current = env[setting.name];
  if (current !== undefined) return current;
  for (const old of setting.oldNames) {
    const value = env[old];
    if (value === undefined) continue;
    warn(`${old} is deprecated and will stop working in the next release; set ${setting.name} instead`);
    return value;
  }
  return undefined;
}

/** Where a config loader's warnings go when its caller passes no logger: one JSON line on stderr. */
export function warnOnStderr(component: string): (message: string) => void {
  const log = createLogger(component);
  return (message) => log.warn(message);
}
