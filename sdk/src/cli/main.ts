#!/usr/bin/env node
/** `warren`: the command line of Warren (cluster, sandboxes, snapshots, templates, nodes, teams and keys). */
import { Command, CommanderError, InvalidArgumentError, Option } from "commander";
import { SDK_VERSION } from "../config.js";
import { cordonNode, createKey, createTeam, listNodes } from "./admin.js";
import { decideApproval, execPolicy, listApprovals, showApproval } from "./approval.js";
import { artifactUrl, deleteArtifacts, downloadArtifact, listArtifacts, publishArtifact } from "./artifact.js";
import { down, status, up } from "./cluster.js";
import { type CliConfig, connectionOpts, type GlobalFlags, resolveConfig } from "./config.js";
import { ExitCode, toCliError } from "./errors.js";
import { Output } from "./output.js";
import {
  createSandbox,
  execInSandbox,
  killSandboxes,
  listSandboxes,
  pauseSandbox,
  resumeSandbox,
  sandboxEvents,
  sandboxInfo,
  sandboxLogs,
} from "./sandbox.js";
import { shell } from "./shell.js";
import { deleteSnapshots, forkSandbox, listSnapshots, snapshotSandbox } from "./snapshot.js";
import { buildTemplate, deleteTemplates, listTemplates, templateInfo, templateTags } from "./template.js";

const integer =
  (what: string, min = 0) =>
  (value: string): number => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < min) throw new InvalidArgumentError(`${what} must be an integer ≥ ${min}`);
    return n;
  };
const collect = (value: string, previous: string[] = []) => [...previous, value];

/** The options every command that talks to Warren takes; the admin token only where it is used. */
function connected(cmd: Command, opts: { admin?: boolean } = {}): Command {
  cmd
    .option("--json", "print the result as JSON (for scripts)")
    .option("--api-url <url>", "the api (default: WARREN_API_URL, E2B_API_URL, .warren/env)")
    .option("--api-key <key>", "API key (default: WARREN_API_KEY, E2B_API_KEY, .warren/env)")
    .option("--sandbox-url <url>", "the proxy (default: WARREN_SANDBOX_URL, E2B_SANDBOX_URL, .warren/env)")
    .option("--data-dir <dir>", "the state dir of `warren up` (default: WARREN_DATA_DIR, nearest .warren)");
  if (opts.admin) cmd.option("--admin-token <token>", "admin token (default: WARREN_ADMIN_TOKEN, .warren/env)");
  return cmd;
}

interface Run {
  config: CliConfig;
  out: Output;
  args: string[];
  // biome-ignore lint/suspicious/noExplicitAny: commander's parsed options, typed by each command's declarations
  opts: Record<string, any>;
}

/** An action: resolves the config once, runs, and records the exit code. */
function run(action: (run: Run) => Promise<number>) {
  return async function (this: Command) {
    const opts = this.opts();
    const config = resolveConfig(opts as GlobalFlags);
    process.exitCode = await action({ config, out: new Output(config.json), args: this.args, opts });
  };
}

function clusterCommands(warren: Command): void {
  connected(warren.command("up"))
    .description("start Warren on this machine (PostgreSQL, Redis, master, api, node agents, proxy)")
    .option("-d, --detach", "run in the background and return once it is ready (`warren down` stops it)")
    .addOption(
      new Option("--api-port <port>", "api port (0: any free one)")
        .env("WARREN_API_PORT")
        .argParser(integer("--api-port"))
        .default(3000),
    )
    .addOption(
      new Option("--proxy-port <port>", "proxy port (0: any free one)")
        .env("WARREN_PROXY_PORT")
        .argParser(integer("--proxy-port"))
        .default(3002),
    )
    .option("--node-agents <n>", "node agents to run", integer("--node-agents", 1), 1)
    .option("--pool-size <n>", "warm sandboxes per node agent", integer("--pool-size"))
    .option("--instance-prefix <prefix>", "prefix of the node agents' instance names (netns, veth, cgroups)")
    .option("--node-cidr <cidr>", "sandbox address range of a node agent (repeat for each)", collect, [])
    .addOption(
      new Option("--database-url <url>", "use this PostgreSQL (default: a private one)").env("WARREN_DATABASE_URL"),
    )
    .addOption(new Option("--redis-url <url>", "use this Redis (default: a private one)").env("WARREN_REDIS_URL"))
    .addOption(
      new Option(
        "--domain <domain>",
        "serve E2B's domain layout over TLS (<port>-<id>.<domain>, api.<domain>): clients need only E2B_DOMAIN",
      ).env("WARREN_DOMAIN"),
    )
    .addOption(
      new Option("--tls-cert <file>", "PEM certificate for <domain> and *.<domain> (with --domain)").env(
        "WARREN_TLS_CERT",
      ),
    )
    .addOption(new Option("--tls-key <file>", "PEM key of --tls-cert").env("WARREN_TLS_KEY"))
    .addOption(
      new Option("--tls-ca <file>", "PEM CA that signed --tls-cert, when this machine does not trust it").env(
        "WARREN_TLS_CA",
      ),
    )
    .option("--timeout <seconds>", "give up if not ready by then", integer("--timeout", 1), 900)
    .action(
      run(({ config, out, opts }) =>
        up(
          config,
          {
            detach: opts.detach === true,
            apiPort: opts.apiPort,
            proxyPort: opts.proxyPort,
            nodeAgents: opts.nodeAgents,
            poolSize: opts.poolSize,
            instancePrefix: opts.instancePrefix,
            nodeCidr: opts.nodeCidr,
            databaseUrl: opts.databaseUrl,
            redisUrl: opts.redisUrl,
            domain: opts.domain,
            tlsCert: opts.tlsCert,
            tlsKey: opts.tlsKey,
            tlsCa: opts.tlsCa,
            timeout: opts.timeout,
          },
          out,
        ),
      ),
    );

  connected(warren.command("down"))
    .description("stop the Warren that `warren up` started; its sandboxes are removed")
    .option("--timeout <seconds>", "kill what is left after this long", integer("--timeout", 1), 120)
    .action(run(({ config, out, opts }) => down(config, out, opts.timeout)));

  connected(warren.command("status"), { admin: true })
    .description("is Warren running? (exit 0 yes, 3 no)")
    .action(run(({ config, out }) => status(config, out)));
}

function sandboxCommands(warren: Command): void {
  const sandbox = warren.command("sandbox").alias("sbx").description("create, inspect and use sandboxes");
  const conn = (config: CliConfig) => connectionOpts(config);

  connected(sandbox.command("create"))
    .description("create a sandbox and print its id")
    .argument("[template]", "template id or alias", "base")
    .option("--timeout <seconds>", "lifetime (default: the server's)", integer("--timeout", 1))
    .option("--metadata <KEY=value>", "metadata (repeatable)", collect)
    .option("--env <KEY=value>", "environment variable (repeatable)", collect)
    .action(run(({ config, out, args, opts }) => createSandbox(conn(config), args[0], opts, out)));

  connected(sandbox.command("list").alias("ls"))
    .description("list sandboxes")
    .option("--state <states>", "running, paused or running,paused")
    .option("--metadata <KEY=value>", "only sandboxes with this metadata (repeatable)", collect)
    .action(run(({ config, out, opts }) => listSandboxes(conn(config), opts, out)));

  connected(sandbox.command("info"))
    .description("show a sandbox")
    .argument("<id>", "sandbox id")
    .action(run(({ config, out, args }) => sandboxInfo(conn(config), args[0] as string, out)));

  connected(sandbox.command("kill"))
    .description("kill sandboxes")
    .argument("<id...>", "sandbox ids")
    .action(run(({ config, out, args }) => killSandboxes(conn(config), args, out)));

  connected(sandbox.command("pause"))
    .description("pause a sandbox (`sandbox resume` brings it back)")
    .argument("<id>", "sandbox id")
    .action(run(({ config, out, args }) => pauseSandbox(conn(config), args[0] as string, out)));

  connected(sandbox.command("resume"))
    .description("resume a paused sandbox")
    .argument("<id>", "sandbox id")
    .option("--timeout <seconds>", "new lifetime", integer("--timeout", 1))
    .action(run(({ config, out, args, opts }) => resumeSandbox(conn(config), args[0] as string, opts.timeout, out)));

  connected(sandbox.command("snapshot"))
    .description("take a snapshot of a sandbox (it keeps running) and print its id, a template for `sandbox create`")
    .argument("<id>", "sandbox id")
    .option("--name <name>", "name the snapshot (a name used again moves to the new snapshot)")
    .action(run(({ config, out, args, opts }) => snapshotSandbox(conn(config), args[0] as string, opts, out)));

  connected(sandbox.command("fork"))
    .description("start copies of a running sandbox (one capture) and print their ids, one a line")
    .argument("<id>", "sandbox id")
    .option("--count <n>", "how many copies", integer("--count", 1), 1)
    .option(
      "--timeout <seconds>",
      "lifetime of each copy (default: the server's, 15 s as on E2B)",
      integer("--timeout", 1),
    )
    .action(run(({ config, out, args, opts }) => forkSandbox(conn(config), args[0] as string, opts, out)));

  connected(sandbox.command("exec"))
    .description("run a command in a sandbox and exit with its exit code")
    .argument("<id>", "sandbox id")
    .argument("<command...>", "the command: one argument is a shell command line, several are quoted")
    .option("--stdin", "send this process's stdin to the command")
    .option("--cwd <dir>", "working directory")
    .option("--user <user>", "run as this user")
    .option("--env <KEY=value>", "environment variable (repeatable)", collect)
    .option("--timeout <seconds>", "kill the command after this long (default: none)", integer("--timeout", 1))
    .option(
      "--secret <name>",
      "a team secret as an env var of this command only, masked in its output (repeatable)",
      collect,
    )
    .option(
      "--lease-ms <ms>",
      "lease: renewed while this CLI waits; reaped (SIGTERM, then SIGKILL) this long after it stops",
      integer("--lease-ms", 100),
    )
    .addHelpText(
      "after",
      "\nExamples:\n  warren sandbox exec ID -- ls -la /\n  warren sandbox exec ID 'make test && echo ok'\n  git diff | warren sandbox exec --stdin ID -- git apply",
    )
    .action(
      run(({ config, out, args, opts }) => execInSandbox(conn(config), args[0] as string, args.slice(1), opts, out)),
    );

  connected(sandbox.command("shell"))
    .description("an interactive terminal in a sandbox (Ctrl-] detaches; the shell keeps running)")
    .argument("<id>", "sandbox id")
    .option("--attach <pid>", "re-attach to this terminal, replaying its scrollback", integer("--attach", 1))
    .option("--cwd <dir>", "working directory")
    .option("--user <user>", "run as this user")
    .action(run(({ config, args, opts }) => shell(conn(config), args[0] as string, opts)));

  connected(sandbox.command("logs"))
    .description("a sandbox's lifecycle log")
    .argument("<id>", "sandbox id")
    .action(run(({ config, out, args }) => sandboxLogs(conn(config), args[0] as string, out)));

  connected(sandbox.command("events"))
    .description("a sandbox's event ledger (--follow streams new events until Ctrl-C)")
    .argument("<id>", "sandbox id")
    .option("-f, --follow", "keep streaming new events")
    .option("--cursor <id>", "start after this event id")
    .option("--limit <n>", "page size", integer("--limit", 1))
    .action(run(({ config, out, args, opts }) => sandboxEvents(conn(config), args[0] as string, opts, out)));

  artifactCommands(warren, sandbox);
}

function artifactCommands(warren: Command, sandbox: Command): void {
  connected(sandbox.command("publish"))
    .description("freeze a file or folder of a sandbox into an artifact (kept after the sandbox) and print its id")
    .argument("<id>", "sandbox id")
    .argument("<path>", "absolute path in the sandbox")
    .option("--format <format>", "tar (default) or zip")
    .option("--out <file>", "also download the artifact to this file")
    .action(
      run(({ config, out, args, opts }) =>
        publishArtifact(connectionOpts(config), args[0] as string, args[1] as string, opts, out),
      ),
    );
  const artifact = warren.command("artifact").description("artifacts (`warren sandbox publish ID PATH` makes one)");
  connected(artifact.command("list").alias("ls"))
    .description("list your team's artifacts, newest first")
    .option("--sandbox <id>", "only artifacts of this sandbox")
    .action(run(({ config, out, opts }) => listArtifacts(connectionOpts(config), opts, out)));
  connected(artifact.command("url"))
    .description("print a signed download URL (works without an API key until it expires)")
    .argument("<id>", "artifact id")
    .option("--expires <seconds>", "how long the URL works (default 900)", integer("--expires", 1))
    .action(run(({ config, out, args, opts }) => artifactUrl(connectionOpts(config), args[0] as string, opts, out)));
  connected(artifact.command("download"))
    .description("download an artifact to a file")
    .argument("<id>", "artifact id")
    .argument("<file>", "where to write it")
    .action(
      run(({ config, out, args }) =>
        downloadArtifact(connectionOpts(config), args[0] as string, args[1] as string, out),
      ),
    );
  connected(artifact.command("delete").alias("rm"))
    .description("delete artifacts")
    .argument("<id...>", "artifact ids")
    .action(run(({ config, out, args }) => deleteArtifacts(connectionOpts(config), args, out)));
}

function approvalCommands(warren: Command): void {
  const approval = warren
    .command("approval")
    .description("commands and file operations the team's exec policy holds for review");
  connected(approval.command("list").alias("ls"))
    .description("list approvals, newest first")
    .option("--state <state>", "pending, approved, rejected, used or expired")
    .option("--sandbox <id>", "only this sandbox's")
    .action(run(({ config, out, opts }) => listApprovals(connectionOpts(config), opts, out)));
  connected(approval.command("show"))
    .description("show what an approval is for")
    .argument("<id>", "approval id")
    .action(run(({ config, out, args }) => showApproval(connectionOpts(config), args[0] as string, out)));
  for (const verdict of ["approve", "reject"] as const) {
    connected(approval.command(verdict))
      .description(`${verdict} a pending request (an approver API key)`)
      .argument("<id>", "approval id")
      .option("--reason <text>", "why, kept with the decision")
      .action(
        run(({ config, out, args, opts }) =>
          decideApproval(connectionOpts(config), args[0] as string, verdict, opts, out),
        ),
      );
  }
  const policy = warren.command("exec-policy").description("the team's exec policy (allow, deny or review rules)");
  connected(policy.command("get"))
    .description("print the policy")
    .action(run(({ config, out }) => execPolicy(connectionOpts(config), "get", undefined, out)));
  connected(policy.command("set"))
    .description("replace the policy with the JSON file's (an approver API key)")
    .argument(
      "<file>",
      "JSON: {rules: [{action, command?, asRoot?, paths?, ops?, name?}], default?, reviewTtlSeconds?}",
    )
    .action(run(({ config, out, args }) => execPolicy(connectionOpts(config), "set", args[0] as string, out)));
  connected(policy.command("clear"))
    .description("remove the policy (an approver API key)")
    .action(run(({ config, out }) => execPolicy(connectionOpts(config), "clear", undefined, out)));
}

function snapshotCommands(warren: Command): void {
  const snapshot = warren.command("snapshot").description("snapshots (`warren sandbox snapshot ID` takes one)");
  connected(snapshot.command("list").alias("ls"))
    .description("list snapshots, newest first")
    .option("--sandbox <id>", "only snapshots of this sandbox")
    .option("--name <name>", "only the snapshot with this name or id")
    .action(run(({ config, out, opts }) => listSnapshots(connectionOpts(config), opts, out)));
  connected(snapshot.command("delete").alias("rm"))
    .description("delete snapshots (sandboxes made from them keep running)")
    .argument("<id...>", "snapshot ids or names")
    .action(run(({ config, out, args }) => deleteSnapshots(connectionOpts(config), args, out)));
}

function templateCommands(warren: Command): void {
  const template = warren.command("template").alias("tpl").description("build, list, tag and delete templates");
  const conn = (config: CliConfig) => connectionOpts(config);

  connected(template.command("build"))
    .description("build a template from a Dockerfile or a template file and follow it; prints the template id")
    .argument("<name>", "name, optionally with a tag: name or name:tag")
    .option("-f, --file <Dockerfile>", "the Dockerfile (default: e2b.Dockerfile or Dockerfile in the context dir)")
    .option("--template-file <file.json>", "a template file: the JSON of Template.toJSON (see the SDK's README)")
    .option("--context <dir>", "the directory COPY sources are relative to (default: the working directory)")
    .option("--tag <tag>", "another tag for this build (repeatable)", collect)
    .option("--cpu <n>", "vCPUs of sandboxes from it (1 or even, default the server's: 2)", integer("--cpu", 1))
    .option(
      "--memory-mb <n>",
      "memory of sandboxes from it, MiB (even, default the server's: 1024)",
      integer("--memory-mb", 128),
    )
    .option("--start-cmd <command>", "start command, running when a sandbox is created (replaces CMD)")
    .option("--ready-cmd <command>", "exits 0 once the start command is ready (default: sleep 20)")
    .option("--no-cache", "rebuild every layer")
    .addHelpText(
      "after",
      "\nExamples:\n  warren template build my-app -f Dockerfile --context .\n" +
        "  warren template build my-app:v2 --tag stable --cpu 4 --memory-mb 4096\n" +
        "  TPL=$(warren template build my-app --json | jq -r .templateId)",
    )
    .action(run(({ config, out, args, opts }) => buildTemplate(conn(config), args[0] as string, opts, out)));

  connected(template.command("list").alias("ls"))
    .description("list your team's templates")
    .action(run(({ config, out }) => listTemplates(conn(config), out)));

  connected(template.command("info"))
    .description("show a template: resources, tags and builds")
    .argument("<name>", "template id or name")
    .action(run(({ config, out, args }) => templateInfo(conn(config), args[0] as string, out)));

  connected(template.command("delete").alias("rm"))
    .description("delete templates (not while sandboxes use them)")
    .argument("<name...>", "template ids or names")
    .action(run(({ config, out, args }) => deleteTemplates(conn(config), args, out)));

  connected(template.command("tags"))
    .description("list a template's tags, or --assign / --remove some")
    .argument("<name>", "template name; with --assign, name:tag picks the build to tag (default tag: default)")
    .option("--assign <tag>", "point this tag at the build of <name> (repeatable)", collect)
    .option("--remove <tag>", "remove this tag (repeatable; never `default`)", collect)
    .action(run(({ config, out, args, opts }) => templateTags(conn(config), args[0] as string, opts, out)));
}

function adminCommands(warren: Command): void {
  const team = warren.command("team").description("teams (admin)");
  connected(team.command("create"), { admin: true })
    .description("create a team and its first API key")
    .argument("<name>", "team name")
    .action(run(({ config, out, args }) => createTeam(config, args[0] as string, out)));

  const node = warren.command("node").description("nodes (admin)");
  connected(node.command("list").alias("ls"), { admin: true })
    .description("list the nodes with their state and cordon")
    .action(run(({ config, out }) => listNodes(config, out)));
  connected(node.command("cordon"), { admin: true })
    .description("cordon a node: no new sandboxes there; paused ones resume on other nodes")
    .argument("<id>", "node id")
    .action(run(({ config, out, args }) => cordonNode(config, args[0] as string, true, out)));
  connected(node.command("uncordon"), { admin: true })
    .description("lift a node's cordon")
    .argument("<id>", "node id")
    .action(run(({ config, out, args }) => cordonNode(config, args[0] as string, false, out)));

  const key = warren.command("key").description("API keys (admin)");
  connected(key.command("create"), { admin: true })
    .description("create an API key for a team")
    .requiredOption("--team <id>", "team id")
    .option("--name <name>", "a name for the key")
    .option("--approver", "the key may change the exec policy and approve or reject held-back requests")
    .action(run(({ config, out, opts }) => createKey(config, opts.team, opts.name, out, opts.approver === true)));
}

export function warrenProgram(): Command {
  const warren = new Command("warren")
    .description("Warren: a self-hostable sandbox cloud for AI agents, wire-compatible with E2B")
    .version(SDK_VERSION)
    .showHelpAfterError("(add --help for usage)")
    .addHelpText(
      "after",
      "\nExit codes: 0 ok, 1 failure, 2 usage, 3 not running (status), 4 unreachable, 5 auth, 6 not found;\n" +
        "`sandbox exec` and `sandbox shell` exit with the command's own code.",
    );
  clusterCommands(warren);
  sandboxCommands(warren);
  snapshotCommands(warren);
  templateCommands(warren);
  approvalCommands(warren);
  adminCommands(warren);
  warren.exitOverride();
  for (const cmd of allCommands(warren)) cmd.exitOverride();
  return warren;
}

function allCommands(cmd: Command): Command[] {
  return cmd.commands.flatMap((c) => [c, ...allCommands(c)]);
}

async function main(): Promise<void> {
  try {
    await warrenProgram().parseAsync(process.argv);
  } catch (error) {
    if (error instanceof CommanderError) {
      // commander has printed the message (or the help) already.
      process.exitCode = error.exitCode === 0 ? ExitCode.ok : ExitCode.usage;
      return;
    }
    const failure = toCliError(error);
    process.stderr.write(`warren: ${failure.message}\n`);
    if (failure.hint) process.stderr.write(`hint: ${failure.hint}\n`);
    process.exitCode = failure.exitCode;
  }
}

await main();
// Idle keep-alive sockets of the SDK's envd transport would otherwise hold the process open after a
// shell ends; every write is done (stdout/stderr are synchronous on Linux for files, pipes and TTYs).
process.exit();
