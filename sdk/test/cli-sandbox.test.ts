import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pty from "@lydell/node-pty";
import { LocalCluster } from "@warren/local";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { cleanEnv, eventually, startWarren, WARREN_CLI, warren } from "./cli-harness.js";

// The CLI as a user runs it: a child process against a real single-node cluster, configured only by
// the env file the cluster wrote into its data dir (WARREN_DATA_DIR), as `warren up` leaves it.
const dataDir = mkdtempSync(join(tmpdir(), "warren-cli-"));
const cluster = new LocalCluster({
  dataDir,
  nodeAgents: 1,
  poolSize: 1,
  instancePrefix: "c",
  nodeCidr: () => "10.212.0.0/22",
});
const env = () => cleanEnv({ WARREN_DATA_DIR: dataDir });

async function createSandbox(): Promise<string> {
  const res = await warren(["sandbox", "create"], env());
  expect(res.code, res.stderr).toBe(0);
  const id = res.stdout.trim();
  expect(id).toMatch(/^[a-z0-9]+$/);
  return id;
}

beforeAll(async () => {
  await cluster.start();
  cluster.writeEnvFile(join(dataDir, "env"));
}, 900_000);

afterAll(async () => {
  await cluster.stop();
  rmSync(dataDir, { recursive: true, force: true });
}, 180_000);

describe("warren sandbox", () => {
  it("create prints the id alone; list and info show the sandbox, as text and as --json", async () => {
    const id = await createSandbox();

    const list = await warren(["sandbox", "list"], env());
    expect(list.code).toBe(0);
    expect(list.stdout).toMatch(/SANDBOX ID\s+TEMPLATE\s+STATE/);
    expect(list.stdout).toMatch(new RegExp(`${id}\\s+base\\s+running`));

    const listJson = await warren(["sandbox", "list", "--json"], env());
    expect(listJson.code).toBe(0);
    const listed = JSON.parse(listJson.stdout) as { sandboxId: string; state: string }[];
    expect(listed).toContainEqual(expect.objectContaining({ sandboxId: id, state: "running" }));

    const info = await warren(["sandbox", "info", id, "--json"], env());
    expect(info.code).toBe(0);
    expect(JSON.parse(info.stdout)).toMatchObject({ sandboxId: id, templateId: "base", state: "running" });

    const createdJson = await warren(["sandbox", "create", "--json", "--metadata", "purpose=cli-test"], env());
    expect(createdJson.code).toBe(0);
    const body = JSON.parse(createdJson.stdout) as { sandboxId: string; metadata: Record<string, string> };
    expect(body.metadata).toEqual({ purpose: "cli-test" });
    expect(createdJson.stderr).toBe("");
  });

  it("exec streams stdout and stderr and exits with the command's exit code", async () => {
    const id = await createSandbox();
    const ok = await warren(["sandbox", "exec", id, "--", "echo", "hello world"], env());
    expect(ok).toMatchObject({ code: 0, stdout: "hello world\n" });

    const failing = await warren(["sandbox", "exec", id, "echo out; echo err >&2; exit 7"], env());
    expect(failing.code).toBe(7);
    expect(failing.stdout).toBe("out\n");
    expect(failing.stderr).toBe("err\n");

    const json = await warren(["sandbox", "exec", "--json", id, "--", "sh", "-c", "echo x; exit 3"], env());
    expect(json.code).toBe(3);
    expect(JSON.parse(json.stdout)).toMatchObject({ sandboxId: id, exitCode: 3, stdout: "x\n" });
  });

  it("exec --stdin sends the CLI's stdin to the command and closes it", async () => {
    const id = await createSandbox();
    const res = await warren(
      ["sandbox", "exec", "--stdin", id, "--", "tr", "a-z", "A-Z"],
      env(),
      60_000,
      "hello\nworld\n",
    );
    expect(res).toMatchObject({ code: 0, stdout: "HELLO\nWORLD\n" });
  });

  it("Ctrl-C on exec ends the command in the sandbox too and exits 130", async () => {
    const id = await createSandbox();
    const run = startWarren(["sandbox", "exec", id, "--", "sh", "-c", "echo started; sleep 300"], env());
    await eventually(() => (run.output().stdout.includes("started") ? true : undefined));
    run.child.kill("SIGINT");
    expect((await run.done).code).toBe(130);
    const left = await warren(["sandbox", "exec", id, "ps -eo args | grep -c '^[s]leep 300' || true"], env());
    expect(left).toMatchObject({ code: 0, stdout: "0\n" });
  });

  it("pause and resume: the sandbox is listed as paused, then runs again with its files", async () => {
    const id = await createSandbox();
    expect((await warren(["sandbox", "exec", id, "echo kept > /tmp/mark"], env())).code).toBe(0);
    const pause = await warren(["sandbox", "pause", id], env());
    expect(pause.code, pause.stderr).toBe(0);
    const paused = await warren(["sandbox", "list", "--state", "paused", "--json"], env());
    expect(JSON.parse(paused.stdout)).toContainEqual(expect.objectContaining({ sandboxId: id, state: "paused" }));

    const resume = await warren(["sandbox", "resume", id, "--json"], env());
    expect(resume.code, resume.stderr).toBe(0);
    expect(JSON.parse(resume.stdout)).toMatchObject({ sandboxId: id, state: "running" });
    expect(await warren(["sandbox", "exec", id, "cat /tmp/mark"], env())).toMatchObject({ code: 0, stdout: "kept\n" });
  });

  it("kill removes the sandbox, and killing or inspecting it again exits 6 with a hint", async () => {
    const id = await createSandbox();
    const kill = await warren(["sandbox", "kill", id], env());
    expect(kill).toMatchObject({ code: 0, stdout: `killed ${id}\n` });

    const again = await warren(["sandbox", "kill", id], env());
    expect(again.code).toBe(6);
    expect(again.stderr).toContain("hint: `warren sandbox list`");

    const info = await warren(["sandbox", "info", id], env());
    expect(info.code).toBe(6);
    expect(info.stderr).toMatch(/not found/i);
  });

  it("events and logs show the sandbox's lifecycle", async () => {
    const id = await createSandbox();
    const events = await warren(["sandbox", "events", id, "--json"], env());
    expect(events.code, events.stderr).toBe(0);
    const list = JSON.parse(events.stdout) as { sandboxId: string; type: string; id: string }[];
    expect(list.length).toBeGreaterThan(0);
    expect(list.every((e) => e.sandboxId === id)).toBe(true);

    const text = await warren(["sandbox", "events", id], env());
    expect(text.code).toBe(0);
    expect(text.stdout).toContain(list[0]?.type);

    const logs = await warren(["sandbox", "logs", id, "--json"], env());
    expect(logs.code, logs.stderr).toBe(0);
    expect((JSON.parse(logs.stdout) as unknown[]).length).toBeGreaterThan(0);
  });

  it("events --follow streams new events as JSON lines until Ctrl-C, then exits 0", async () => {
    const id = await createSandbox();
    const follow = startWarren(["sandbox", "events", id, "--follow", "--json"], env());
    await eventually(() => (follow.output().stdout.includes('"sandbox.started"') ? true : undefined));
    expect((await warren(["sandbox", "kill", id], env())).code).toBe(0);
    await eventually(() => (follow.output().stdout.includes('"sandbox.killed"') ? true : undefined));
    follow.child.kill("SIGINT");
    const end = await follow.done;
    expect(end.code).toBe(0);
    const types = end.stdout
      .trim()
      .split("\n")
      .map((line) => (JSON.parse(line) as { type: string }).type);
    expect(types).toEqual(expect.arrayContaining(["sandbox.created", "sandbox.started", "sandbox.killed"]));
  });
});

describe("warren sandbox snapshot / fork and warren snapshot", () => {
  it("snapshot prints the id; list finds it by sandbox and name; create from it and fork have its files; delete", async () => {
    const id = await createSandbox();
    expect((await warren(["sandbox", "exec", id, "echo snapped > /home/user/mark"], env())).code).toBe(0);

    const named = await warren(["sandbox", "snapshot", id, "--name", "cli-snap"], env());
    expect(named.code, named.stderr).toBe(0);
    const snapshotId = named.stdout.trim();
    expect(snapshotId).toMatch(/\/cli-snap:default$/);
    const unnamed = await warren(["sandbox", "snapshot", id, "--json"], env());
    expect(unnamed.code, unnamed.stderr).toBe(0);
    const info = JSON.parse(unnamed.stdout) as { snapshotId: string; names: string[]; memory: boolean };
    expect(info).toMatchObject({ names: [], memory: expect.any(Boolean), sizeBytes: expect.any(Number) });

    const bySandbox = await warren(["snapshot", "list", "--sandbox", id, "--json"], env());
    expect(bySandbox.code, bySandbox.stderr).toBe(0);
    const listed = JSON.parse(bySandbox.stdout) as { snapshotId: string; sandboxId: string }[];
    expect(listed.map((s) => s.snapshotId)).toEqual([info.snapshotId, snapshotId]);
    expect(listed.every((s) => s.sandboxId === id)).toBe(true);
    const byName = await warren(["snapshot", "list", "--name", "cli-snap"], env());
    expect(byName.code, byName.stderr).toBe(0);
    expect(byName.stdout).toMatch(/SNAPSHOT ID\s+SANDBOX\s+CREATED/);
    expect(byName.stdout).toContain(snapshotId);
    expect(byName.stdout).not.toContain(info.snapshotId);

    const child = await warren(["sandbox", "create", snapshotId], env());
    expect(child.code, child.stderr).toBe(0);
    const childId = child.stdout.trim();
    expect(await warren(["sandbox", "exec", childId, "cat /home/user/mark"], env())).toMatchObject({
      code: 0,
      stdout: "snapped\n",
    });

    const fork = await warren(["sandbox", "fork", id, "--count", "2", "--timeout", "120"], env());
    expect(fork.code, fork.stderr).toBe(0);
    const forks = fork.stdout.trim().split("\n");
    expect(forks).toHaveLength(2);
    expect(new Set([...forks, id]).size).toBe(3);
    for (const forkId of forks) {
      expect(await warren(["sandbox", "exec", forkId, "cat /home/user/mark"], env())).toMatchObject({
        code: 0,
        stdout: "snapped\n",
      });
    }

    expect(await warren(["snapshot", "delete", snapshotId], env())).toMatchObject({
      code: 0,
      stdout: `deleted ${snapshotId}\n`,
    });
    const again = await warren(["snapshot", "delete", snapshotId], env());
    expect(again.code).toBe(6);
    expect(again.stderr).toContain("hint: `warren snapshot list`");
    const json = await warren(["snapshot", "delete", info.snapshotId, "--json"], env());
    expect(JSON.parse(json.stdout)).toEqual({ snapshotId: info.snapshotId, deleted: true });
    expect((await warren(["sandbox", "kill", childId, ...forks], env())).code).toBe(0);
    // Fifteen CLI processes, two snapshots, a create and a fork of two.
  }, 180_000);

  it("fork --json lists each fork; snapshot or fork of an unknown sandbox exits 6", async () => {
    const id = await createSandbox();
    const fork = await warren(["sandbox", "fork", id, "--json", "--timeout", "60"], env());
    expect(fork.code, fork.stderr).toBe(0);
    const forks = JSON.parse(fork.stdout) as { sandboxId: string }[];
    expect(forks).toEqual([{ sandboxId: expect.stringMatching(/^[a-z0-9]+$/) }]);
    expect((await warren(["sandbox", "kill", forks[0]?.sandboxId as string], env())).code).toBe(0);

    const snapshot = await warren(["sandbox", "snapshot", "nosuchsandbox"], env());
    expect(snapshot.code).toBe(6);
    expect(snapshot.stderr).toMatch(/not found/i);
    expect((await warren(["sandbox", "fork", "nosuchsandbox"], env())).code).toBe(6);
  });
});

describe("configuration and errors", () => {
  it("a bad API key (a flag beats the env file) fails with exit 5 and a hint", async () => {
    const res = await warren(["sandbox", "list", "--api-key", "e2b_0000000000000000000000000000000000000000"], env());
    expect(res.code).toBe(5);
    expect(res.stderr).toMatch(/^warren: .*Unauthorized/m);
    expect(res.stderr).toContain("hint: set an API key");
  });

  it("the environment beats the env file: a wrong E2B_API_URL is used and reported as unreachable", async () => {
    const res = await warren(["sandbox", "list"], { ...env(), E2B_API_URL: "http://127.0.0.1:9" });
    expect(res.code).toBe(4);
    expect(res.stderr).toContain("hint: is it running?");
  });

  it("an unknown command or a missing argument is a usage error (exit 2)", async () => {
    expect((await warren(["sandbox", "frobnicate"], env())).code).toBe(2);
    const missing = await warren(["sandbox", "info"], env());
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain("missing required argument 'id'");
  });

  it("every command answers --help with its usage and exit 0", async () => {
    const commands = [
      [],
      ["up"],
      ["down"],
      ["status"],
      ...[
        "create",
        "list",
        "info",
        "kill",
        "pause",
        "resume",
        "snapshot",
        "fork",
        "exec",
        "shell",
        "logs",
        "events",
      ].map((c) => ["sandbox", c]),
      ["snapshot", "list"],
      ["snapshot", "delete"],
      ["node", "list"],
      ["node", "cordon"],
      ["node", "uncordon"],
      ["template", "list"],
      ["template", "build"],
      ["template", "info"],
      ["template", "delete"],
      ["template", "tags"],
      ["team", "create"],
      ["key", "create"],
      ...["list", "show", "approve", "reject"].map((c) => ["approval", c]),
      ...["get", "set", "clear"].map((c) => ["exec-policy", c]),
    ];
    for (const command of commands) {
      const res = await warren([...command, "--help"], env());
      expect(res.code, command.join(" ")).toBe(0);
      expect(res.stdout).toContain(`Usage: warren ${command.join(" ")}`.trimEnd());
    }
    // One CLI process per command, ~1 s each on a loaded 2-core machine.
  }, 180_000);

  // `warren template ...` is tested in cli-template.test.ts (request shaping) and template-cluster.test.ts.
});

describe("warren team and key (admin)", () => {
  it("team create gives a working key; key create adds another; both with the admin token", async () => {
    const team = await warren(["team", "create", "cli-team", "--json"], env());
    expect(team.code, team.stderr).toBe(0);
    const body = JSON.parse(team.stdout) as { team: { id: string; name: string }; apiKey: { key: string } };
    expect(body.team.name).toBe("cli-team");

    const own = await warren(["sandbox", "list", "--json", "--api-key", body.apiKey.key], env());
    expect(own.code).toBe(0);
    expect(JSON.parse(own.stdout)).toEqual([]); // a new team sees none of the first team's sandboxes

    const key = await warren(["key", "create", "--team", body.team.id, "--name", "ci", "--json"], env());
    expect(key.code, key.stderr).toBe(0);
    const second = (JSON.parse(key.stdout) as { key: string }).key;
    expect(second).not.toBe(body.apiKey.key);
    expect((await warren(["sandbox", "list", "--api-key", second], env())).code).toBe(0);
  });

  it("admin commands without the right admin token exit 5 with a hint", async () => {
    const wrong = await warren(["team", "create", "x", "--admin-token", "nope"], env());
    expect(wrong.code).toBe(5);
    expect(wrong.stderr).toContain("hint: use WARREN_ADMIN_TOKEN");
    const noTeam = await warren(["key", "create", "--team", "no-such-team"], env());
    expect(noTeam.code).toBe(6);
  });
});

describe("warren node (admin)", () => {
  it("node list shows the node; cordon and uncordon answer and show in the list; an unknown node exits 6", async () => {
    const list = await warren(["node", "list", "--json"], env());
    expect(list.code, list.stderr).toBe(0);
    const nodes = JSON.parse(list.stdout) as { id: string; state: string; cordonedAt: string | null }[];
    expect(nodes).toHaveLength(1);
    const node = nodes[0] as (typeof nodes)[number];
    expect(node).toMatchObject({ state: "up", cordonedAt: null });
    const text = await warren(["node", "list"], env());
    expect(text.stdout).toMatch(new RegExp(`^${node.id}\\s+\\S+\\s+up\\s+no\\s`, "m"));

    try {
      expect(await warren(["node", "cordon", node.id], env())).toMatchObject({
        code: 0,
        stdout: `cordoned node ${node.id}\n`,
      });
      const cordoned = JSON.parse((await warren(["node", "list", "--json"], env())).stdout) as typeof nodes;
      expect(cordoned[0]?.cordonedAt).toEqual(expect.any(String));
    } finally {
      const uncordon = await warren(["node", "uncordon", node.id, "--json"], env());
      expect(uncordon.code, uncordon.stderr).toBe(0);
      expect(JSON.parse(uncordon.stdout)).toEqual({ nodeId: node.id, cordoned: false });
    }
    const after = JSON.parse((await warren(["node", "list", "--json"], env())).stdout) as typeof nodes;
    expect(after[0]?.cordonedAt).toBeNull();

    for (const verb of ["cordon", "uncordon"]) {
      const unknown = await warren(["node", verb, "no-such-node"], env());
      expect(unknown.code).toBe(6);
      expect(unknown.stderr).toContain("warren: node 'no-such-node' not found");
      expect(unknown.stderr).toContain("hint: `warren node list` shows the nodes");
    }
  });
});

describe("warren sandbox shell", () => {
  function spawnShell(args: string[]) {
    const term = pty.spawn(process.execPath, [WARREN_CLI, "sandbox", "shell", ...args], {
      name: "xterm-256color",
      cols: 80,
      rows: 24,
      env: env() as Record<string, string>,
    });
    let screen = "";
    term.onData((data) => {
      screen += data;
    });
    const exited = new Promise<number>((resolve) => term.onExit(({ exitCode }) => resolve(exitCode)));
    /** Waits until the output after `from` matches; returns the offset after the match. */
    const until = async (pattern: RegExp, from = 0): Promise<number> => {
      for (;;) {
        const match = pattern.exec(screen.slice(from));
        if (match) return from + match.index + match[0].length;
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    };
    return { term, exited, until, screen: () => screen };
  }

  it("is an interactive terminal: keystrokes, resize (tput cols), Ctrl-C to the shell, exit code", async () => {
    const id = await createSandbox();
    const { term, exited, until } = spawnShell([id]);
    let at = await until(/[$#] $/m);
    term.write("echo hi-$((6*7))\r");
    at = await until(/hi-42/, at);

    term.resize(123, 40);
    // SIGWINCH reaches the CLI, which resizes the sandbox's terminal; a new command sees the new size.
    await new Promise((resolve) => setTimeout(resolve, 500));
    term.write("tput cols\r");
    at = await until(/\r123\r*\n/, at);

    term.write("echo started-$((0+1)); sleep 600\r");
    at = await until(/\rstarted-1\r*\n/, at);
    await new Promise((resolve) => setTimeout(resolve, 300));
    term.write("\x03"); // Ctrl-C interrupts the sandbox's foreground job (130 = killed by SIGINT), not the CLI
    term.write("echo after-$?\r");
    at = await until(/\rafter-130\r*\n/, at);

    term.write("exit 4\r");
    void at;
    expect(await exited).toBe(4);
  });

  it("Ctrl-] detaches, and --attach re-attaches with the scrollback replayed", async () => {
    const id = await createSandbox();
    const first = spawnShell([id]);
    await first.until(/[$#] $/m);
    first.term.write("echo remember-$((2*21))\r");
    await first.until(/remember-42/);
    first.term.write("\x1d");
    expect(await first.exited).toBe(0);
    const pid = /--attach (\d+)/.exec(first.screen())?.[1];
    expect(pid).toBeDefined();

    const second = spawnShell([id, "--attach", pid as string]);
    await second.until(/remember-42/); // from the scrollback, printed before we re-attached
    second.term.write("exit\r");
    expect(await second.exited).toBe(0);
  });

  it("refuses to run without a terminal (exit 2) and points to exec", async () => {
    const id = await createSandbox();
    const res = await warren(["sandbox", "shell", id], env());
    expect(res.code).toBe(2);
    expect(res.stderr).toContain("hint: for scripts use `warren sandbox exec");
  });
});
