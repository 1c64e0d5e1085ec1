import { mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { LocalCluster } from "@warren/local";
import { freePort } from "@warren/local/services";
import { Sandbox, Template } from "e2b";
import { type Browser, type BrowserContext, chromium, type Page } from "playwright-core";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";

// The web console in a real browser (Debian's chromium, headless, driven by playwright-core) against a whole
// cluster: api (serving /console) → master → node agent; the browser reaches envd through the proxy's host routing
// (`49983-<id>.localhost:<proxy port>`: Chromium resolves every *.localhost name to loopback by itself).
const ARTIFACTS = resolve(fileURLToPath(new URL("../../.warren/artifacts/console", import.meta.url)));
const dataDir = mkdtempSync(join(tmpdir(), "warren-console-"));
let cluster: LocalCluster;
let env: { apiUrl: string; apiKey: string; adminToken: string };
let otherTeamKey = "";
let browser: Browser;
let context: BrowserContext;
let page: Page;
const requestedUrls: string[] = [];
const browserErrors: string[] = [];

function sdkOpts(apiKey: string) {
  return { apiKey, apiUrl: env.apiUrl, sandboxUrl: process.env.E2B_SANDBOX_URL as string, requestTimeoutMs: 30_000 };
}

async function shot(name: string): Promise<void> {
  await page.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });
}

beforeAll(async () => {
  mkdirSync(ARTIFACTS, { recursive: true });
  const proxyPort = await freePort();
  cluster = new LocalCluster({
    dataDir,
    nodeAgents: 1,
    poolSize: 1,
    instancePrefix: "b",
    nodeCidr: () => "10.234.0.0/22",
    readyTemplates: ["base"],
    proxyPort,
    env: {
      WARREN_CONSOLE_SANDBOX_URL: `http://{port}-{sandboxID}.localhost:${proxyPort}`,
      WARREN_METRICS_INTERVAL_MS: "1000",
    },
  });
  const started = await cluster.start();
  process.env.E2B_SANDBOX_URL = started.E2B_SANDBOX_URL;
  env = { apiUrl: started.E2B_API_URL, apiKey: started.E2B_API_KEY, adminToken: started.WARREN_ADMIN_TOKEN };
  const res = await fetch(`${env.apiUrl}/warren/v1/admin/teams`, {
    method: "POST",
    headers: { "X-Admin-Token": env.adminToken, "Content-Type": "application/json" },
    body: JSON.stringify({ name: "console-other-team" }),
  });
  otherTeamKey = ((await res.json()) as { apiKey: { key: string } }).apiKey.key;

  browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    headless: true,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  // A fresh context is a fresh, empty profile (playwright gives each its own user-data-dir).
  context = await browser.newContext({ viewport: { width: 1280, height: 900 }, acceptDownloads: true });
  page = await context.newPage();
  page.on("request", (request) => requestedUrls.push(request.url()));
  page.on("console", (message) => {
    if (message.type() === "error") browserErrors.push(message.text());
  });
}, 900_000);

afterEach(async (ctx) => {
  if (ctx.task.result?.state === "fail" && page) {
    await shot(`failed-${ctx.task.name.slice(0, 40).replace(/[^a-z0-9]+/gi, "-")}`).catch(() => undefined);
  }
});

afterAll(async () => {
  await browser?.close();
  await cluster?.stop();
  rmSync(dataDir, { recursive: true, force: true });
}, 120_000);

describe("the web console in a browser against a whole cluster", () => {
  it("refuses a wrong API key with the api's message and keeps the sign-in page", async () => {
    await page.goto(`${env.apiUrl}/console`);
    await page.getByTestId("secret").waitFor();
    const paint = await page.evaluate(
      () => performance.getEntriesByName("first-contentful-paint")[0]?.startTime ?? Number.NaN,
    );
    await page.reload();
    await page.getByTestId("secret").waitFor();
    const warm = await page.evaluate(
      () => performance.getEntriesByName("first-contentful-paint")[0]?.startTime ?? Number.NaN,
    );
    console.log(
      `console: first contentful paint ${Math.round(paint)} ms (fresh browser), ${Math.round(warm)} ms (reload)`,
    );
    await page.getByTestId("secret").fill("e2b_0000000000000000000000000000000000000000");
    await page.getByRole("button", { name: "Sign in" }).click();
    await expect.poll(() => page.getByTestId("sign-in-error").textContent()).toContain("Invalid API key");
    await shot("sign-in-error");
  });

  it("signs in with a key, then shows a sandbox created through the SDK without a reload; another team's never", async () => {
    await page.getByTestId("secret").fill(env.apiKey);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.getByRole("heading", { name: "Sandboxes" }).waitFor();
    await page.getByRole("link", { name: "Templates" }).click();
    await page.getByText("This team has built no templates.").waitFor();
    await page.getByRole("link", { name: "Sandboxes" }).click();
    await page.getByRole("heading", { name: "Sandboxes" }).waitFor();
    await expect.poll(() => page.getByTestId("live-status").textContent(), { timeout: 15_000 }).toBe("Live");

    const foreign = await Sandbox.create("base", sdkOpts(otherTeamKey));
    const mine = await Sandbox.create("base", { ...sdkOpts(env.apiKey), metadata: { owner: "console-test" } });
    try {
      const row = page.locator(`tr[data-sandbox-id="${mine.sandboxId}"]`);
      await row.waitFor({ timeout: 30_000 });
      expect(await row.textContent()).toContain("owner=console-test");
      // The node column: the api's nodeID (a Warren extra on E2B's listed sandbox), the cluster's only node.
      expect(await row.getByTestId("sandbox-node").textContent()).toBe("node-ba");
      expect(await page.locator(`tr[data-sandbox-id="${foreign.sandboxId}"]`).count()).toBe(0);
      // Search narrows the list to what matches.
      await page.getByPlaceholder("id, template, node, key=value").fill("owner=nobody");
      await page.getByText("No sandbox matches the filters.").waitFor();
      await page.getByPlaceholder("id, template, node, key=value").fill("owner=console");
      await row.waitFor();
      await shot("sandboxes");
    } finally {
      await foreign.kill();
    }
    (globalThis as { consoleSandbox?: Sandbox }).consoleSandbox = mine;
  }, 90_000);

  it("runs a command in the terminal and reads its output; Ctrl-C interrupts", async () => {
    const sandbox = (globalThis as { consoleSandbox?: Sandbox }).consoleSandbox!;
    await page.locator(`tr[data-sandbox-id="${sandbox.sandboxId}"] a`).click();
    await page.getByRole("link", { name: "Terminal" }).click();
    await expect.poll(() => page.getByTestId("terminal-status").textContent(), { timeout: 30_000 }).toBe("Connected");
    await page.getByTestId("terminal").click();
    await page.keyboard.type("echo $((6*7))\n");
    const rows = page.locator(".xterm-rows");
    await expect
      .poll(async () => (await rows.innerText()).split("\n").map((l) => l.trim()), { timeout: 15_000 })
      .toContain("42");
    await page.keyboard.type("sleep 300\n");
    // Ctrl-C once sleep is the terminal's foreground process, as a person would (earlier, bash itself gets it).
    await expect
      .poll(async () => (await sandbox.commands.run("pgrep -x sleep || true")).stdout.trim(), { timeout: 15_000 })
      .not.toBe("");
    await new Promise((r) => setTimeout(r, 200));
    await page.keyboard.press("Control+C");
    await expect.poll(async () => (await sandbox.commands.run("pgrep -x sleep || true")).stdout.trim()).toBe("");
    await page.keyboard.type("echo after-$((1+1))\n");
    await expect
      .poll(async () => (await rows.innerText()).split("\n").map((l) => l.trim()), { timeout: 15_000 })
      .toContain("after-2");
    await shot("terminal");
  }, 60_000);

  it("re-attaches the terminal after a network drop and replays the output it missed", async () => {
    const rows = page.locator(".xterm-rows");
    const status = page.getByTestId("terminal-status");
    const lines = async () => (await rows.innerText()).split("\n").map((l) => l.trim());
    await page.keyboard.type("echo start-$((2*2)); sleep 2; echo back-$((3*3))\n");
    // The command has started (so all of it reached the shell) before the browser goes offline.
    await expect.poll(lines, { timeout: 15_000 }).toContain("start-4");
    await context.setOffline(true);
    await page.getByRole("button", { name: "Reconnect" }).click();
    await expect.poll(() => status.textContent(), { timeout: 10_000 }).toContain("reconnecting");
    // The shell prints while the browser is offline; envd holds it for the replay.
    await new Promise((r) => setTimeout(r, 3000));
    await context.setOffline(false);
    await expect.poll(() => status.textContent(), { timeout: 20_000 }).toBe("Connected");
    await expect
      .poll(async () => (await rows.innerText()).split("\n").map((l) => l.trim()), { timeout: 15_000 })
      .toContain("back-9");
    const text = await rows.innerText();
    expect(text.split("\n").filter((l) => l.trim() === "back-9")).toHaveLength(1);
    expect(text).toContain("after-2");
    expect(text).not.toContain("were lost while away");
  }, 60_000);

  it("uploads a file, lists it, downloads it byte-identical, makes, renames and deletes a folder", async () => {
    const sandbox = (globalThis as { consoleSandbox?: Sandbox }).consoleSandbox!;
    await page.getByRole("link", { name: "Files" }).click();
    await page.getByTestId("file-table").waitFor({ timeout: 30_000 });
    const content = Buffer.from(Array.from({ length: 70_000 }, (_, i) => (i * 7) % 256));
    await page
      .getByTestId("upload-input")
      .setInputFiles({ name: "upload.bin", mimeType: "application/octet-stream", buffer: content });
    const row = page.locator('tr[data-file="upload.bin"]');
    await row.waitFor({ timeout: 15_000 });
    expect(Buffer.from(await sandbox.files.read("/home/user/upload.bin", { format: "bytes" }))).toEqual(content);

    const download = page.waitForEvent("download");
    await row.getByRole("button", { name: "Download" }).click();
    const saved = await (await download).path();
    expect(readFileSync(saved)).toEqual(content);

    await page.getByLabel("New folder name").fill("made-here");
    await page.getByRole("button", { name: "Make folder" }).click();
    await page.locator('tr[data-file="made-here"]').waitFor();
    await page.locator('tr[data-file="made-here"]').getByRole("button", { name: "Rename" }).click();
    await page.getByLabel("New name for made-here").fill("renamed");
    await page.getByRole("button", { name: "Save" }).click();
    await page.locator('tr[data-file="renamed"]').waitFor();
    expect(await sandbox.files.exists("/home/user/renamed")).toBe(true);
    const del = page.locator('tr[data-file="renamed"]').getByRole("button", { name: "Delete" });
    await del.click();
    await page.locator('tr[data-file="renamed"]').getByRole("button", { name: "Confirm delete" }).click();
    await expect.poll(() => page.locator('tr[data-file="renamed"]').count()).toBe(0);
    expect(await sandbox.files.exists("/home/user/renamed")).toBe(false);
    await shot("files");
  }, 60_000);

  it("draws the metrics charts from the stored series and shows the live timeline", async () => {
    await page.getByRole("link", { name: "Metrics" }).click();
    await page.locator('[data-testid="chart-cpu"] canvas').waitFor({ timeout: 30_000 });
    await shot("metrics");
    await page.getByRole("link", { name: "Logs" }).click();
    await expect.poll(() => page.getByTestId("logs").textContent(), { timeout: 15_000 }).toContain("sandbox.created");
    await page.getByRole("link", { name: "Timeline" }).click();
    await expect
      .poll(() => page.getByTestId("timeline").textContent(), { timeout: 15_000 })
      .toContain("sandbox.created");
  }, 60_000);

  it("pauses and resumes from the sandbox page; the state follows the ledger live", async () => {
    await page.getByRole("button", { name: "Pause" }).click();
    await expect.poll(() => page.getByTestId("sandbox-state").textContent(), { timeout: 60_000 }).toBe("paused");
    await expect
      .poll(() => page.getByTestId("timeline").textContent(), { timeout: 15_000 })
      .toContain("sandbox.paused");
    await shot("paused");
    await page.getByRole("button", { name: "Resume" }).click();
    await expect.poll(() => page.getByTestId("sandbox-state").textContent(), { timeout: 60_000 }).toBe("running");
    await expect.poll(() => page.getByTestId("outcome").textContent()).toContain("Resumed");
  }, 150_000);

  it("takes a snapshot from the sandbox page and shows its name", async () => {
    const outcome = page.getByTestId("outcome");
    await page.getByRole("button", { name: "Snapshot" }).click();
    await expect.poll(() => outcome.textContent(), { timeout: 60_000 }).toMatch(/^Snapshot \S+ taken/);
    expect(await page.getByTestId("sandbox-node").textContent()).toBe("node-ba");
  }, 90_000);

  it("forks from the sandbox page into a running sandbox of the same team", async () => {
    const outcome = page.getByTestId("outcome");
    await page.getByRole("button", { name: "Fork" }).click();
    await expect.poll(() => outcome.textContent(), { timeout: 90_000 }).toMatch(/^Forked into [a-z0-9]+$/);
    const forkId = ((await outcome.textContent()) ?? "").split(" ")[2]!;
    const listed = await Sandbox.list({ ...sdkOpts(env.apiKey), query: { state: ["running"] } }).nextItems();
    expect(listed.map((s) => s.sandboxId)).toContain(forkId);
    await shot("forked");
    await Sandbox.kill(forkId, sdkOpts(env.apiKey));
  }, 120_000);

  it("lists a snapshot taken through the SDK without a reload, creates a sandbox from it and deletes it", async () => {
    const sandbox = (globalThis as { consoleSandbox?: Sandbox }).consoleSandbox!;
    await page.getByRole("link", { name: "Snapshots" }).click();
    await page.getByRole("heading", { name: "Snapshots" }).waitFor();
    // The one the page's Snapshot button took is already there.
    await page.getByTestId("snapshot-table").waitFor({ timeout: 15_000 });
    await expect.poll(() => page.getByTestId("snapshots-live").textContent(), { timeout: 15_000 }).toBe("Live");
    const before = await page.locator("tr[data-snapshot-id]").count();
    expect(before).toBeGreaterThanOrEqual(1);

    const info = await sandbox.createSnapshot({ name: "console-sdk" });
    const row = page.locator(`tr[data-snapshot-id="${info.snapshotId}"]`);
    await row.waitFor({ timeout: 30_000 });
    expect(await row.textContent()).toContain(sandbox.sandboxId);
    expect(await page.locator("tr[data-snapshot-id]").count()).toBe(before + 1);
    await shot("snapshots");

    const outcome = page.getByTestId("outcome");
    await row.getByRole("button", { name: "Create sandbox" }).click();
    await expect.poll(() => outcome.textContent(), { timeout: 60_000 }).toMatch(/^Created sandbox [a-z0-9]+ from /);
    const childId = ((await outcome.textContent()) ?? "").split(" ")[2]!;
    expect(await outcome.textContent()).toBe(`Created sandbox ${childId} from ${info.snapshotId}`);
    await page.getByTestId("snapshot-created-sandbox").getByRole("link", { name: childId }).waitFor();
    const child = await Sandbox.connect(childId, sdkOpts(env.apiKey));
    expect((await child.commands.run("echo from-snapshot")).stdout.trim()).toBe("from-snapshot");
    await child.kill();

    await row.getByRole("button", { name: "Delete" }).click();
    await row.getByRole("button", { name: "Confirm delete" }).click();
    await expect.poll(() => outcome.textContent(), { timeout: 30_000 }).toBe(`Deleted snapshot ${info.snapshotId}`);
    await expect.poll(() => row.count()).toBe(0);
    const left = await Sandbox.listSnapshots({ ...sdkOpts(env.apiKey), sandboxId: sandbox.sandboxId }).nextItems();
    expect(left.map((s) => s.snapshotId)).not.toContain(info.snapshotId);
    // Back to the sandbox's page for the tests that follow.
    await page.locator(`tr[data-snapshot-id] a[href$="/sandboxes/${sandbox.sandboxId}"]`).first().click();
    await page.getByTestId("sandbox-state").waitFor();
  }, 180_000);

  it("shows a template's builds with their logs, adds and removes a tag, and deletes it", async () => {
    await Template.build(Template().fromTemplate("base").runCmd("echo console-build-step"), "console-tpl", {
      apiKey: env.apiKey,
      apiUrl: env.apiUrl,
    });
    await page.getByRole("link", { name: "Templates" }).click();
    await page.getByRole("link", { name: /console-tpl$/ }).click();
    await expect.poll(() => page.getByRole("log").textContent(), { timeout: 15_000 }).toContain("console-build-step");
    await page.getByLabel("New tag").fill("v1");
    await page.getByRole("button", { name: "Add tag" }).click();
    await page.getByRole("button", { name: "Remove tag v1" }).waitFor();
    await shot("template");
    await page.getByRole("button", { name: "Remove tag v1" }).click();
    await expect.poll(() => page.getByRole("button", { name: "Remove tag v1" }).count()).toBe(0);
    await page.getByRole("button", { name: "Delete template" }).click();
    await page.getByRole("button", { name: "Confirm delete" }).click();
    await page.getByText("This team has built no templates.").waitFor({ timeout: 15_000 });
  }, 240_000);

  it("creates from a template, sets a timeout and kills from the list; a killed sandbox leaves list and cluster", async () => {
    const sandbox = (globalThis as { consoleSandbox?: Sandbox }).consoleSandbox!;
    await page.getByRole("link", { name: "Sandboxes" }).first().click();
    const row = page.locator(`tr[data-sandbox-id="${sandbox.sandboxId}"]`);
    await row.waitFor();

    await page.getByRole("button", { name: "Create sandbox" }).click();
    const outcome = page.getByTestId("outcome");
    await expect
      .poll(() => outcome.textContent(), { timeout: 30_000 })
      .toMatch(/^Created sandbox [a-z0-9]+ from base$/);
    const createdId = ((await outcome.textContent()) ?? "").split(" ")[2]!;
    await page.locator(`tr[data-sandbox-id="${createdId}"]`).waitFor({ timeout: 15_000 });
    await Sandbox.kill(createdId, sdkOpts(env.apiKey));
    await expect.poll(() => page.locator(`tr[data-sandbox-id="${createdId}"]`).count(), { timeout: 15_000 }).toBe(0);

    await row.getByLabel(`New timeout in seconds for ${sandbox.sandboxId}`).fill("600");
    await row.getByRole("button", { name: "Set timeout" }).click();
    await expect.poll(() => outcome.textContent()).toBe(`${sandbox.sandboxId} now ends in 10m 0s`);
    const info = await sandbox.getInfo();
    expect(new Date(info.endAt).getTime() - Date.now()).toBeGreaterThan(500_000);

    await row.getByRole("button", { name: "Kill" }).click();
    await row.getByRole("button", { name: "Confirm kill" }).click();
    await expect.poll(() => row.count(), { timeout: 30_000 }).toBe(0);
    await expect.poll(() => page.getByTestId("outcome").textContent()).toContain(`Killed ${sandbox.sandboxId}`);
    expect(await sandbox.isRunning()).toBe(false);
    await shot("after-kill");
  }, 60_000);

  it("holds a command for review, shows it live on the Approvals page, approves it there, and it runs once", async () => {
    // The plain key sees the page, not the buttons: the api's 403 message says why.
    await page.getByRole("link", { name: "Approvals" }).click();
    await page.getByRole("heading", { name: "Approvals" }).waitFor();
    await expect
      .poll(() => page.getByTestId("not-approver").textContent(), { timeout: 15_000 })
      .toContain("needs an approver API key");
    await page.getByText("This team has no exec policy.").waitFor();
    expect(await page.getByRole("button", { name: "Set a policy" }).count()).toBe(0);

    const admin = (method: string, path: string, body?: unknown) =>
      fetch(`${env.apiUrl}${path}`, {
        method,
        headers: { "X-Admin-Token": env.adminToken, "Content-Type": "application/json" },
        ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
      }).then((res) => res.json() as Promise<unknown>);
    const teams = (await admin("GET", "/warren/v1/admin/teams")) as { id: string; name: string }[];
    const team = teams.find((t) => t.name.startsWith("local-"))!;
    const approverKey = (
      (await admin("POST", `/warren/v1/admin/teams/${team.id}/api-keys`, {
        name: "console-approver",
        approver: true,
      })) as {
        key: string;
      }
    ).key;
    const clearPolicy = () =>
      fetch(`${env.apiUrl}/warren/v1/exec-policy`, { method: "DELETE", headers: { "X-API-Key": approverKey } });

    await page.getByRole("button", { name: "Sign out" }).click();
    await page.getByTestId("secret").fill(approverKey);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.getByRole("link", { name: "Approvals" }).click();
    await page.getByRole("heading", { name: "Approvals" }).waitFor();
    let sandbox: Sandbox | undefined;
    try {
      // The policy through the page's editor: the api's 400 names the field inline, then a valid one is saved.
      await page.getByRole("button", { name: "Set a policy" }).click();
      const editor = page.getByTestId("policy-json");
      await editor.fill(JSON.stringify({ rules: [{ command: "rm -rf *", action: "maybe" }] }));
      await page.getByRole("button", { name: "Save policy" }).click();
      await expect.poll(() => page.getByTestId("policy-error").textContent()).toContain("rules[0].action");
      await editor.fill(
        JSON.stringify({
          rules: [{ name: "console review", command: "rm -rf *", action: "review" }],
          reviewTtlSeconds: 600,
        }),
      );
      await page.getByRole("button", { name: "Save policy" }).click();
      await expect.poll(() => page.getByTestId("outcome").textContent()).toBe("Saved the exec policy");
      const rules = page.getByTestId("policy-rules");
      await expect.poll(() => rules.textContent()).toContain("console review");
      expect(await rules.textContent()).toContain('command "rm -rf *"');
      await expect.poll(() => page.getByTestId("approvals-live").textContent(), { timeout: 15_000 }).toBe("Live");
      await page.getByText("No request is waiting for a decision.").waitFor();

      // The official SDK's command is held back; its error names the approval.
      sandbox = await Sandbox.create("base", sdkOpts(env.apiKey));
      await sandbox.commands.run("mkdir -p /tmp/victim && touch /tmp/victim/a");
      const error = await sandbox.commands.run("rm -rf /tmp/victim").then(
        () => undefined,
        (e: Error) => e,
      );
      const id = /approval (apr_[0-9a-f]{20})/.exec(error?.message ?? "")?.[1];
      expect(id, error?.message ?? "the command ran").toBeDefined();
      expect(await sandbox.files.exists("/tmp/victim/a")).toBe(true);

      // On the page without a reload (the ledger's exec.review_requested), with the nav's pending count.
      const row = page.getByTestId("pending-approvals").locator(`tr[data-approval-id="${id}"]`);
      await row.waitFor({ timeout: 15_000 });
      const text = await row.textContent();
      for (const part of ["rm -rf /tmp/victim", "/home/user", sandbox.sandboxId, "console review"]) {
        expect(text).toContain(part);
      }
      await expect.poll(() => page.getByTestId("pending-count").textContent()).toBe("1 pending");
      await shot("approvals-pending");

      await row.getByLabel(`Reason for ${id}`).fill("cleanup is fine");
      await row.getByRole("button", { name: "Approve" }).click();
      await expect.poll(() => page.getByTestId("outcome").textContent()).toBe(`Approved ${id}`);
      const decided = page.getByTestId("decided-approvals").locator(`tr[data-approval-id="${id}"]`);
      await expect
        .poll(() => decided.getByTestId("approval-state").textContent(), { timeout: 15_000 })
        .toBe("approved");
      expect(await decided.textContent()).toContain("cleanup is fine");
      await expect.poll(() => page.getByTestId("pending-count").count()).toBe(0);

      // Sent again with the id, it runs; the page follows it to used.
      const ran = await sandbox.commands.run("rm -rf /tmp/victim", { envs: { WARREN_APPROVAL_ID: id! } });
      expect(ran.exitCode).toBe(0);
      expect(await sandbox.files.exists("/tmp/victim")).toBe(false);
      await expect.poll(() => decided.getByTestId("approval-state").textContent(), { timeout: 15_000 }).toBe("used");
      await shot("approvals");
      await page.emulateMedia({ colorScheme: "dark" });
      await shot("approvals-dark");
      await page.emulateMedia({ colorScheme: "light" });

      // The sandbox's timeline has the same story.
      await decided.getByRole("link", { name: sandbox.sandboxId }).click();
      const timeline = page.getByTestId("timeline");
      await expect.poll(() => timeline.textContent(), { timeout: 15_000 }).toContain("exec.approval_used");
      // Each exec event in one line: what was asked, under which rule, and the approver's reason.
      const story = await timeline.textContent();
      for (const part of [
        "exec.review_requested",
        "exec.approved",
        'rule "console review"',
        "reason: cleanup is fine",
      ]) {
        expect(story).toContain(part);
      }
      await shot("approvals-timeline");

      await page.getByRole("link", { name: "Approvals" }).click();
      await page.getByRole("button", { name: "Clear policy" }).click();
      await page.getByRole("button", { name: "Confirm clear" }).click();
      await page.getByText("This team has no exec policy.").waitFor({ timeout: 15_000 });
      expect((await sandbox.commands.run("rm -rf /tmp/nothing-held")).exitCode).toBe(0);
    } finally {
      await clearPolicy();
      await sandbox?.kill();
    }
  }, 120_000);

  it("shows nodes (cordon, uncordon) and teams (create, with its key shown once) to the admin token", async () => {
    await page.getByRole("button", { name: "Sign out" }).click();
    await page.getByLabel("The admin token (nodes, teams and keys)").check();
    await page.getByTestId("secret").fill(env.adminToken);
    await page.getByRole("button", { name: "Sign in" }).click();
    const row = page.getByTestId("node-table").locator("tr", { hasText: "node-ba" });
    await row.waitFor({ timeout: 15_000 });
    expect(await row.textContent()).toContain("up");
    await row.getByRole("button", { name: "Cordon" }).click();
    await expect.poll(() => page.getByTestId("outcome").textContent()).toBe("Cordoned node-ba");
    await expect.poll(() => row.textContent()).toContain("cordoned");
    await page.emulateMedia({ colorScheme: "dark" });
    await shot("nodes-dark");
    await page.emulateMedia({ colorScheme: "light" });
    await row.getByRole("button", { name: "Uncordon" }).click();
    await expect.poll(() => row.textContent()).toContain("schedulable");

    await page.getByRole("link", { name: "Teams & keys" }).click();
    await page.getByText("console-other-team").waitFor();
    await page.getByLabel("Team name").fill("console-made");
    await page.getByRole("button", { name: "Create team" }).click();
    await expect.poll(() => page.locator(".secret").textContent()).toMatch(/e2b_[0-9a-f]{40}/);
    await page.getByText("console-made").first().waitFor();
    await shot("teams");
  }, 60_000);

  it("lists a team's API keys and revokes one with its Revoke button", async () => {
    const team = page.locator("tr[data-team-id]", { hasText: "console-made" });
    const teamId = (await team.getAttribute("data-team-id"))!;
    await team.getByRole("button", { name: "Show API keys of console-made" }).click();
    const keys = page.getByTestId(`keys-${teamId}`);
    await keys.waitFor({ timeout: 15_000 });
    // The team's first key, made with the team.
    await expect.poll(() => keys.locator("tr[data-key-id]").count()).toBe(1);

    // The box still shows the key the team was made with: the new one replaces it.
    const shown = page.locator(".secret code").first();
    const teamKey = await shown.textContent();
    await team.getByRole("button", { name: "New API key" }).click();
    await expect.poll(() => shown.textContent()).not.toBe(teamKey);
    const secret = (await page.locator(".secret code").first().textContent())!;
    const keyId = (await page.locator(".secret code").nth(1).textContent())!;
    const keyRow = keys.locator(`tr[data-key-id="${keyId}"]`);
    await keyRow.waitFor({ timeout: 15_000 });
    expect(await keyRow.textContent()).toContain(secret.slice(0, 10));
    expect(await keys.textContent()).not.toContain(secret);
    expect(await keyRow.getByTestId("key-status").textContent()).toBe("active");
    const works = await fetch(`${env.apiUrl}/v2/sandboxes`, { headers: { "X-API-Key": secret } });
    expect(works.status).toBe(200);

    await keyRow.getByRole("button", { name: "Revoke" }).click();
    await keyRow.getByRole("button", { name: "Confirm revoke" }).click();
    await expect.poll(() => keyRow.getByTestId("key-status").textContent(), { timeout: 15_000 }).toBe("revoked");
    await expect.poll(() => page.getByTestId("outcome").textContent()).toBe(`Revoked ${keyId} (console-made)`);
    expect(await keyRow.getByRole("button", { name: "Revoke" }).count()).toBe(0);
    const refused = await fetch(`${env.apiUrl}/v2/sandboxes`, { headers: { "X-API-Key": secret } });
    expect(refused.status).toBe(401);
    await shot("team-keys");
  }, 60_000);

  it("never put the API key in a URL, and kept it in session storage only", async () => {
    expect(requestedUrls.length).toBeGreaterThan(10);
    expect(requestedUrls.filter((u) => u.includes(env.apiKey) || u.includes(env.adminToken))).toEqual([]);
    expect(page.url()).not.toContain(env.apiKey);
    const stored = await page.evaluate(() => ({
      session: JSON.stringify(sessionStorage),
      local: JSON.stringify(localStorage),
    }));
    // Signed in as admin now: the API key left session storage with the sign-out.
    expect(stored.session).toContain(env.adminToken);
    expect(stored.session).not.toContain(env.apiKey);
    expect(stored.local).not.toContain(env.apiKey);
    expect(stored.local).not.toContain(env.adminToken);
    expect((await context.cookies()).length).toBe(0);
    // The strict CSP held: nothing the console does was blocked by it.
    expect(browserErrors.filter((e) => /Content Security Policy/i.test(e))).toEqual([]);
  });
});
