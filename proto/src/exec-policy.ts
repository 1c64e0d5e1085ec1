/**
 * A team's exec policy (issue 24, part 4): the contract between the api (validates and stores it), the master
 * (mirrors it into Redis under `execPolicyKey(team)`) and the proxy (evaluates it on every envd `process.Start`
 * and file write or remove of the team's sandboxes). One module so the three agree on the shape and the matching.
 */

export type ExecAction = "allow" | "deny" | "review";
export type FileOp = "write" | "remove";

export const EXEC_ACTIONS: readonly ExecAction[] = ["allow", "deny", "review"];
export const FILE_OPS: readonly FileOp[] = ["write", "remove"];

/**
 * One rule. A command rule (`command` and/or `asRoot`) applies to process starts; a path rule (`paths`) applies to
 * file operations (`ops`, default both) on a path equal to or under one of `paths`. Rules are tried in order; the
 * first that matches decides.
 */
export interface ExecRule {
  /** Shown in answers and the ledger; default `rule N` (1-based). */
  readonly name?: string;
  readonly action: ExecAction;
  /**
   * Wildcard pattern (`*` any run of characters, `?` one) matched against the whole command line: for a shell
   * invocation (`bash -l -c SCRIPT`, as E2B's SDKs send commands) the script, else the program and its arguments
   * joined by spaces.
   */
  readonly command?: string;
  /** Matches starts that run as root (with `command`: both must match). */
  readonly asRoot?: boolean;
  /** Absolute paths: the rule covers each path and everything under it. */
  readonly paths?: readonly string[];
  readonly ops?: readonly FileOp[];
}

export interface ExecPolicy {
  readonly rules: readonly ExecRule[];
  /** What nothing matched gets; default `allow`. */
  readonly default?: ExecAction;
  /** How long a review waits for a decision, and an approval for its use; default 3600, 10..604800. */
  readonly reviewTtlSeconds?: number;
}

export const DEFAULT_REVIEW_TTL_SECONDS = 3600;
const MAX_RULES = 200;
const MAX_PATTERN = 1024;
const MAX_PATHS = 64;

/** Redis key of a team's policy (JSON of ExecPolicy); no key: the team has no policy. */
export function execPolicyKey(teamId: string): string {
  return `warren:exec-policy:${teamId}`;
}

/**
 * Written by the master after every full sync of the policies into Redis. A proxy that enforces policies and finds
 * it missing (Redis lost its data) refuses starts and writes until the master has synced again: fail closed.
 */
export const EXEC_POLICIES_SYNCED_KEY = "warren:exec-policies-synced";

/**
 * Where the master announces a change of the mirror, so proxies can keep policies in memory: the message is the team
 * id whose key was just written or deleted, or EXEC_POLICY_EVENT_ALL after a full sync (any key may have changed).
 * Sent after the key's write, so a proxy that drops its copy on the message reads the new value.
 */
export const EXEC_POLICY_EVENTS_CHANNEL = "warren:exec-policy-events";
export const EXEC_POLICY_EVENT_ALL = "*";

/** The policy-events channel of a deployment with this key prefix (channels are never prefixed by the client). */
export function execPolicyEventsChannel(prefix: string): string {
  return `${prefix}${EXEC_POLICY_EVENTS_CHANNEL}`;
}

export class ExecPolicyError extends Error {
  constructor(
    /** The JSON path of the offending field, e.g. `rules[2].command`. */
    readonly field: string,
    message: string,
  ) {
    super(`${field}: ${message}`);
    this.name = "ExecPolicyError";
  }
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function action(value: unknown, field: string): ExecAction {
  if (typeof value !== "string" || !EXEC_ACTIONS.includes(value as ExecAction)) {
    throw new ExecPolicyError(field, `must be one of ${EXEC_ACTIONS.join(", ")}`);
  }
  return value as ExecAction;
}

function absolutePath(value: unknown, field: string): string {
  if (typeof value !== "string" || !value.startsWith("/") || value.length > MAX_PATTERN || value.includes("\0")) {
    throw new ExecPolicyError(field, "must be an absolute path");
  }
  return normalizePath(value);
}

const RULE_FIELDS = new Set(["name", "action", "command", "asRoot", "paths", "ops"]);

function parseRule(raw: unknown, index: number): ExecRule {
  const at = `rules[${index}]`;
  if (!isRecord(raw)) throw new ExecPolicyError(at, "must be an object");
  for (const key of Object.keys(raw)) {
    if (!RULE_FIELDS.has(key)) throw new ExecPolicyError(`${at}.${key}`, "is not a rule field");
  }
  const rule: { -readonly [K in keyof ExecRule]: ExecRule[K] } = { action: action(raw.action, `${at}.action`) };
  if (raw.name !== undefined) {
    if (typeof raw.name !== "string" || raw.name.length === 0 || raw.name.length > 128 || raw.name.includes("\0")) {
      throw new ExecPolicyError(`${at}.name`, "must be a string of 1 to 128 characters");
    }
    rule.name = raw.name;
  }
  if (raw.command !== undefined) {
    if (typeof raw.command !== "string" || raw.command.length === 0 || raw.command.length > MAX_PATTERN) {
      throw new ExecPolicyError(`${at}.command`, `must be a pattern of 1 to ${MAX_PATTERN} characters`);
    }
    if (raw.command.includes("\0")) throw new ExecPolicyError(`${at}.command`, "must not contain NUL");
    rule.command = raw.command;
  }
  if (raw.asRoot !== undefined) {
    if (raw.asRoot !== true) throw new ExecPolicyError(`${at}.asRoot`, "must be true when given");
    rule.asRoot = true;
  }
  if (raw.paths !== undefined) {
    if (!Array.isArray(raw.paths) || raw.paths.length === 0 || raw.paths.length > MAX_PATHS) {
      throw new ExecPolicyError(`${at}.paths`, `must be a list of 1 to ${MAX_PATHS} absolute paths`);
    }
    rule.paths = raw.paths.map((path, i) => absolutePath(path, `${at}.paths[${i}]`));
  }
  if (raw.ops !== undefined) {
    if (rule.paths === undefined) throw new ExecPolicyError(`${at}.ops`, "needs paths");
    if (!Array.isArray(raw.ops) || raw.ops.length === 0) {
      throw new ExecPolicyError(`${at}.ops`, `must be a non-empty list of ${FILE_OPS.join(", ")}`);
    }
    rule.ops = raw.ops.map((op, i) => {
      if (typeof op !== "string" || !FILE_OPS.includes(op as FileOp)) {
        throw new ExecPolicyError(`${at}.ops[${i}]`, `must be one of ${FILE_OPS.join(", ")}`);
      }
      return op as FileOp;
    });
  }
  const commandRule = rule.command !== undefined || rule.asRoot === true;
  if (commandRule && rule.paths !== undefined) {
    throw new ExecPolicyError(at, "a rule matches commands (command, asRoot) or files (paths), not both");
  }
  if (!commandRule && rule.paths === undefined) {
    throw new ExecPolicyError(at, "needs command, asRoot or paths");
  }
  return rule;
}

/** Validates untrusted JSON into a policy; throws ExecPolicyError naming the field. */
export function parseExecPolicy(raw: unknown): ExecPolicy {
  if (!isRecord(raw)) throw new ExecPolicyError("policy", "must be an object");
  for (const key of Object.keys(raw)) {
    if (!["rules", "default", "reviewTtlSeconds"].includes(key)) {
      throw new ExecPolicyError(key, "is not a policy field");
    }
  }
  if (!Array.isArray(raw.rules) || raw.rules.length > MAX_RULES) {
    throw new ExecPolicyError("rules", `must be a list of at most ${MAX_RULES} rules`);
  }
  const policy: { -readonly [K in keyof ExecPolicy]: ExecPolicy[K] } = {
    rules: raw.rules.map((rule, i) => parseRule(rule, i)),
  };
  if (raw.default !== undefined) policy.default = action(raw.default, "default");
  if (raw.reviewTtlSeconds !== undefined) {
    const ttl = raw.reviewTtlSeconds;
    if (typeof ttl !== "number" || !Number.isInteger(ttl) || ttl < 1 || ttl > 604_800) {
      throw new ExecPolicyError("reviewTtlSeconds", "must be an integer from 1 to 604800");
    }
    policy.reviewTtlSeconds = ttl;
  }
  return policy;
}

/** `/a/./b/../c/` → `/a/c`; never above `/`. */
export function normalizePath(path: string): string {
  const parts: string[] = [];
  for (const part of path.split("/")) {
    if (part === "" || part === ".") continue;
    if (part === "..") parts.pop();
    else parts.push(part);
  }
  return `/${parts.join("/")}`;
}

function under(path: string, root: string): boolean {
  return root === "/" || path === root || path.startsWith(`${root}/`);
}

/**
 * Whole-string wildcard match (`*`, `?`) in O(pattern × text) without backtracking blow-up: patterns come from
 * teams and command lines from their agents, so neither may make the proxy spin.
 */
export function wildcardMatch(pattern: string, text: string): boolean {
  let p = 0;
  let t = 0;
  let star = -1;
  let resume = 0;
  while (t < text.length) {
    if (p < pattern.length && (pattern[p] === "?" || pattern[p] === text[t])) {
      p++;
      t++;
    } else if (p < pattern.length && pattern[p] === "*") {
      star = p++;
      resume = t;
    } else if (star !== -1) {
      p = star + 1;
      t = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.length && pattern[p] === "*") p++;
  return p === pattern.length;
}

const SHELLS = new Set(["bash", "sh", "dash", "zsh", "/bin/bash", "/bin/sh", "/usr/bin/bash", "/bin/dash", "/bin/zsh"]);

/**
 * The command lines a start is matched on: the script of a shell's `-c` (E2B's SDKs send `/bin/bash -l -c CMD`) and
 * the program with its arguments. A pattern matching either matches the start.
 */
export function commandLines(cmd: string, args: readonly string[]): string[] {
  const full = [cmd, ...args].join(" ");
  if (SHELLS.has(cmd)) {
    const c = args.findIndex((arg) => /^-[a-z]*c[a-z]*$/.test(arg));
    const script = c >= 0 ? args[c + 1] : undefined;
    if (script !== undefined) return [script, full];
  }
  return [full];
}

/** What is asked of envd, as the policy sees it. */
export type ExecRequest =
  | { readonly kind: "start"; readonly cmd: string; readonly args: readonly string[]; readonly user: string }
  | { readonly kind: FileOp; readonly path: string };

export interface ExecDecision {
  readonly action: ExecAction;
  /** The rule that decided, undefined when none matched (the policy's default). */
  readonly rule?: ExecRule;
  /** Its name: the rule's own or `rule N`; `default` when none matched. */
  readonly ruleName: string;
}

function matches(rule: ExecRule, request: ExecRequest): boolean {
  if (request.kind === "start") {
    if (rule.paths !== undefined) return false;
    if (rule.asRoot && request.user !== "root") return false;
    if (rule.command !== undefined) {
      const pattern = rule.command;
      return commandLines(request.cmd, request.args).some((line) => wildcardMatch(pattern, line));
    }
    return rule.asRoot === true;
  }
  if (rule.paths === undefined) return false;
  if (!(rule.ops ?? FILE_OPS).includes(request.kind)) return false;
  const path = normalizePath(request.path);
  return rule.paths.some((root) => under(path, root));
}

export function evaluateExecPolicy(policy: ExecPolicy, request: ExecRequest): ExecDecision {
  for (const [index, rule] of policy.rules.entries()) {
    if (matches(rule, request)) return { action: rule.action, rule, ruleName: rule.name ?? `rule ${index + 1}` };
  }
  return { action: policy.default ?? "allow", ruleName: "default" };
}

/** Whether any rule (or the default) can refuse file operations: the proxy inspects writes only then. */
export function policyGuardsFiles(policy: ExecPolicy): boolean {
  return (policy.default ?? "allow") !== "allow" || policy.rules.some((rule) => rule.paths !== undefined);
}

/** Request header (Warren SDK) or Start env entry (official SDK) naming an approved review for this one request. */
export const APPROVAL_HEADER = "warren-approval";
export const APPROVAL_ENV = "WARREN_APPROVAL_ID";
/** Answer header: the review a `review` rule opened (the client waits for it, then retries with it). */
export const APPROVAL_ID_HEADER = "warren-approval-id";
