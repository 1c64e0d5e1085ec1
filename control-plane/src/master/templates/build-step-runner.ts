import { randomBytes } from "node:crypto";
import type { Db } from "../../store/db.js";
import { getFiles } from "../../store/template-files.js";
import type { TemplateStep } from "../../store/template-spec.js";
import type { BuildContext } from "../../store/templates.js";
import type { NodeAgentClient } from "../node-agent-client.js";
import type { BuildLog } from "./build-log.js";
import {
  commandEnv,
  copyPlan,
  envExpansionCommand,
  envPairs,
  StepError,
  userCommand,
  workdirCommand,
  workdirTarget,
} from "./build-steps.js";
import { runToExit } from "./start-ready.js";

/** The build sandbox steps run in: its node, id and envd token, the build's signal and log. */
export interface StepSandbox {
  readonly node: NodeAgentClient;
  readonly sandboxId: string;
  readonly token: string;
  readonly signal: AbortSignal;
  readonly buildLog: BuildLog;
}

/** One step of a build, where it stands in the build, and the context the steps before it left. */
export interface BuildStepRun {
  readonly step: TemplateStep;
  readonly context: BuildContext;
  readonly teamId: string;
  /** The log's prefix of the step's output (`builder 2/5`). */
  readonly prefix: string;
  /** The step's phase (`1`…`N`), E2B's `reason.step`. */
  readonly phase: string;
  readonly index: number;
}

/**
 * Runs one of E2B's build steps in the build sandbox through the node agent's `RunCommand` (and `WriteFile` for
 * COPY's archive), as build-steps.ts turns it into commands; resolves with the context the step leaves (user,
 * workdir, ENV). A failed command is a StepError worded as E2B's.
 */
export async function runBuildStep(db: Db, sandbox: StepSandbox, run: BuildStepRun): Promise<BuildContext> {
  const { step, context } = run;
  const exec = async (command: string, user: string, cwd: string | null, log = true) => {
    const output = sandbox.buildLog.output(run.prefix, run.phase);
    const exit = await runToExit(
      sandbox.node.runCommand(
        sandbox.sandboxId,
        sandbox.token,
        // No workdir: the user's home, as E2B's envd does (`~` is the running user's).
        { command, user, cwd: cwd ?? "~", env: commandEnv(context), timeoutMs: 3_600_000 },
        sandbox.signal,
      ),
      log ? (stream, data) => output.write(stream, data) : undefined,
    ).finally(() => output.end());
    if (exit.exitCode !== 0) throw new StepError(`${exit.status || `exit status ${exit.exitCode}`}`);
    return exit.stdout;
  };
  switch (step.type) {
    case "RUN": {
      const [command = "", user] = step.args;
      if (command.trim() === "") throw new StepError("RUN needs a command");
      try {
        await exec(command, user || context.user, context.workdir);
      } catch (error) {
        // E2B's wording: "failed to run command '<cmd>': exit status 1" or "…: command failed: <code>: <why>".
        if (error instanceof StepError) throw new StepError(`failed to run command '${command}': ${error.message}`);
        if (sandbox.signal.aborted) throw error;
        throw new StepError(`failed to run command '${command}': command failed: ${connectReason(error)}`);
      }
      return context;
    }
    case "ENV": {
      const env = { ...context.env };
      for (const [name, value] of envPairs(step))
        env[name] = await exec(envExpansionCommand(value), "root", null, false);
      return { ...context, env };
    }
    case "WORKDIR": {
      const target = workdirTarget(context, step.args[0] ?? "");
      const workdir = (await exec(workdirCommand(target, context.user), "root", null, false)).trim();
      return { ...context, workdir: workdir || target };
    }
    case "USER": {
      const name = step.args[0] ?? "";
      await exec(userCommand(name), "root", null);
      return { ...context, user: name };
    }
    case "COPY": {
      const plan = copyPlan(step, context, `${run.index}-${randomBytes(4).toString("hex")}`);
      const archive = await getFiles(db, run.teamId, step.filesHash as string);
      if (!archive)
        throw new StepError(`the files of COPY ${step.args[0]} (hash ${step.filesHash}) were never uploaded`);
      await sandbox.node.writeFile(sandbox.sandboxId, sandbox.token, plan.archivePath, archive);
      await exec(plan.command, "root", null);
      return context;
    }
  }
}

/** A node call's failure as E2B words one: `unauthenticated: invalid username: 'x'`. */
function connectReason(error: unknown): string {
  const message = (error as Error).message ?? String(error);
  const match = /^([A-Z][A-Za-z]+): (.*)$/s.exec(message.replace(/^failed: /, ""));
  if (!match) return message;
  const code = (match[1] as string).replace(/([a-z])([A-Z])/g, "$1_$2").toLowerCase();
  return `${code}: ${match[2]}`;
}
