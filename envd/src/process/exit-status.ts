import { constants } from "node:os";

/** How a process ended, in the terms of E2B's EndEvent (Go's os.ProcessState). */
export interface ProcessExit {
  /** The exit code, or -1 when a signal ended the process. */
  readonly exitCode: number;
  /** True when the process exited by itself (WIFEXITED). */
  readonly exited: boolean;
  /** Go's ProcessState.String(): "exit status 1", "signal: killed". */
  readonly status: string;
  /** The same text when the process failed; absent on success. */
  readonly error?: string;
}

// Go's names for Linux signals (syscall.Signal.String()), which E2B clients see in `status`.
const GO_SIGNAL_NAMES: Readonly<Record<number, string>> = {
  1: "hangup",
  2: "interrupt",
  3: "quit",
  4: "illegal instruction",
  5: "trace/breakpoint trap",
  6: "aborted",
  7: "bus error",
  8: "floating point exception",
  9: "killed",
  10: "user defined signal 1",
  11: "segmentation fault",
  12: "user defined signal 2",
  13: "broken pipe",
  14: "alarm clock",
  15: "terminated",
  16: "stack fault",
  17: "child exited",
  18: "continued",
  19: "stopped (signal)",
  20: "stopped",
  21: "stopped (tty input)",
  22: "stopped (tty output)",
  23: "urgent I/O condition",
  24: "CPU time limit exceeded",
  25: "file size limit exceeded",
  26: "virtual timer expired",
  27: "profiling timer expired",
  28: "window changed",
  29: "I/O possible",
  30: "power failure",
  31: "bad system call",
};

export function exitedWithCode(code: number): ProcessExit {
  const status = `exit status ${code}`;
  return code === 0 ? { exitCode: 0, exited: true, status } : { exitCode: code, exited: true, status, error: status };
}

export function killedBySignal(signal: NodeJS.Signals | number): ProcessExit {
  const number = typeof signal === "number" ? signal : constants.signals[signal];
  const name = number === undefined ? String(signal) : (GO_SIGNAL_NAMES[number] ?? `signal ${number}`);
  const status = `signal: ${name}`;
  return { exitCode: -1, exited: false, status, error: status };
}

/** The exit Node reports as (code, signal), exactly one of which is set. */
export function processExit(code: number | null, signal: NodeJS.Signals | number | null): ProcessExit {
  if (signal !== null && signal !== 0) return killedBySignal(signal);
  return exitedWithCode(code ?? -1);
}
