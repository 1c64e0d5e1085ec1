// The SDK user of tls-domain.test.ts, run as its own Node process: only E2B_DOMAIN and E2B_API_KEY are set, the
// test CA is trusted through NODE_EXTRA_CA_CERTS (read only at process start, hence a process of its own) and
// `--import e2e/dist/loopback-dns.js` resolves *.<domain> to the proxy's loopback address. Prints one JSON line
// of what it saw; the test asserts on it.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Sandbox, Template } from "e2b";

const mode = process.argv[2] ?? "scenario";

/** fetch that reports failures as values, with the TLS/DNS cause code. */
async function get(url, init) {
  try {
    const res = await fetch(url, init);
    return { status: res.status, body: await res.text() };
  } catch (error) {
    return { error: String(error), cause: error?.cause?.code ?? String(error?.cause ?? "") };
  }
}

async function untrusted() {
  try {
    await Sandbox.list().nextItems();
    return { listed: true };
  } catch (error) {
    return { listed: false, error: String(error), cause: error?.cause?.code ?? String(error?.cause ?? "") };
  }
}

async function scenario() {
  const out = {};
  const sbx = await Sandbox.create("base", { timeoutMs: 120_000 });
  out.sandboxId = sbx.sandboxId;
  out.apiUrl = sbx.connectionConfig.apiUrl;
  out.sandboxDomain = sbx.sandboxDomain;
  out.envdApiUrl = sbx.envdApiUrl;
  try {
    const run = await sbx.commands.run("echo hello from $(id -un)");
    out.run = { exitCode: run.exitCode, stdout: run.stdout };

    await sbx.files.write("/tmp/tls.txt", "written over tls");
    out.read = await sbx.files.read("/tmp/tls.txt");

    // Signed URLs: the SDK signs them with the envd access token; fetched bare, with no header at all.
    out.downloadUrl = await sbx.downloadUrl("/tmp/tls.txt");
    out.download = await get(out.downloadUrl);
    out.uploadUrl = await sbx.uploadUrl("/tmp/uploaded.txt");
    const form = new FormData();
    form.append("file", new Blob(["uploaded over tls"]), "uploaded.txt");
    out.upload = await get(out.uploadUrl, { method: "POST", body: form });
    out.uploadedRead = await sbx.files.read("/tmp/uploaded.txt");

    // A user port: getHost(8000) → 8000-<id>.<domain>, served by python's http.server inside the sandbox.
    await sbx.commands.run("python3 -m http.server 8000 --directory /tmp", { background: true });
    out.host8000 = sbx.getHost(8000);
    const deadline = Date.now() + 30_000;
    do {
      out.port8000 = await get(`https://${out.host8000}/tls.txt`);
      if (out.port8000.status === 200) break;
      await new Promise((resolve) => setTimeout(resolve, 200));
    } while (Date.now() < deadline);
  } finally {
    out.killed = await sbx.kill();
  }
  out.runningAfterKill = await sbx.isRunning();
  out.downloadAfterKill = await get(out.downloadUrl);
  return out;
}

/** A template build whose COPY step uploads its files to the link the api hands out, then a sandbox of it. */
async function template() {
  const out = {};
  const context = mkdtempSync(join(tmpdir(), "warren-tls-template-"));
  try {
    writeFileSync(join(context, "hello.txt"), "copied over tls\n");
    const build = await Template.build(
      Template({ fileContextPath: context }).fromTemplate("base").copy("hello.txt", "/home/user/hello.txt"),
      `tls-copy-${process.pid}`,
    );
    out.templateId = build.templateId;
    const link = await fetch(
      `https://api.${process.env.E2B_DOMAIN}/templates/${build.templateId}/files/${"0".repeat(64)}`,
      {
        headers: { "X-API-KEY": process.env.E2B_API_KEY },
      },
    );
    out.uploadLink = { status: link.status, url: (await link.json()).url };
    const sbx = await Sandbox.create(build.templateId, { timeoutMs: 60_000 });
    try {
      out.copied = await sbx.files.read("/home/user/hello.txt");
    } finally {
      await sbx.kill();
    }
  } catch (error) {
    out.error = String(error);
  } finally {
    rmSync(context, { recursive: true, force: true });
  }
  return out;
}

const result = mode === "untrusted" ? await untrusted() : mode === "template" ? await template() : await scenario();
process.stdout.write(`${JSON.stringify(result)}\n`);
