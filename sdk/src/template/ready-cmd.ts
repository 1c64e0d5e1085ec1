import { shellQuote } from "./shell.js";

/** A readiness check: a shell command that exits 0 once the sandbox's start command is ready. */
export class ReadyCmd {
  constructor(private readonly cmd: string) {}

  getCmd(): string {
    return this.cmd;
  }
}

/** Ready once something listens on `port` (TCP or UDP). */
export function waitForPort(port: number): ReadyCmd {
  // ss's source-port filter matches the exact port (80 does not match 8080); ss exits 0 either way.
  return new ReadyCmd(`[ -n "$(ss -Htuln sport = :${port})" ]`);
}

/** Ready once `url` answers with `statusCode` (default 200). */
export function waitForURL(url: string, statusCode = 200): ReadyCmd {
  return new ReadyCmd(`curl -s -o /dev/null -w "%{http_code}" ${shellQuote(url)} | grep -q "${statusCode}"`);
}

/** Ready once a process named `processName` runs. */
export function waitForProcess(processName: string): ReadyCmd {
  return new ReadyCmd(`pgrep ${shellQuote(processName)} > /dev/null`);
}

/** Ready once the regular file `filename` exists. */
export function waitForFile(filename: string): ReadyCmd {
  return new ReadyCmd(`[ -f ${shellQuote(filename)} ]`);
}

/** Ready after `timeout` ms, rounded down to whole seconds, at least one. */
export function waitForTimeout(timeout: number): ReadyCmd {
  return new ReadyCmd(`sleep ${Math.max(1, Math.floor(timeout / 1000))}`);
}
