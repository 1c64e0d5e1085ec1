import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";

/**
 * A small "outside world" for egress tests, made only of a network namespace this code creates: two web servers
 * with addresses of their own (HTTP on 80 and 8080, HTTPS on 443 with a self-signed certificate) and a DNS server
 * that maps test names to them. The host reaches it through one veth pair and routes for its /24s, so sandbox
 * egress (masqueraded by the node) and the node's egress gateway reach it the way they would reach the internet —
 * and no packet leaves this machine.
 *
 * Addresses are from 198.18.0.0/15 (RFC 2544, benchmarking; never routed on the internet): not a private range,
 * so Warren's default policy treats them as "internet".
 */
export const WORLD = {
  serverA: "198.18.1.10",
  serverB: "198.18.2.10",
  dns: "198.18.0.53",
  /** Names the world's DNS answers. */
  names: {
    "a.test.warren": "198.18.1.10",
    "api.a.test.warren": "198.18.1.10",
    "b.test.warren": "198.18.2.10",
    "meta.test.warren": "169.254.169.254",
  } as Record<string, string>,
} as const;

const SERVER_SCRIPT = `
const http = require("node:http");
const https = require("node:https");
const dgram = require("node:dgram");
const fs = require("node:fs");
const dnsPacket = require(process.env.DNS_PACKET);
const names = JSON.parse(process.env.NAMES);
const tls = { key: fs.readFileSync(process.env.KEY), cert: fs.readFileSync(process.env.CERT) };
const handler = (label) => (req, res) => res.end(label + " " + req.headers.host + " from " + req.socket.remoteAddress);
let pending = 0;
const up = () => { if (--pending === 0) process.stdout.write("ready\\n"); };
for (const [addr, label] of [["${WORLD.serverA}", "server-a"], ["${WORLD.serverB}", "server-b"]]) {
  pending += 3;
  http.createServer(handler(label)).listen(80, addr, up);
  http.createServer(handler(label + ":8080")).listen(8080, addr, up);
  https.createServer(tls, handler(label + ":tls")).listen(443, addr, up);
}
pending += 1;
const dns = dgram.createSocket("udp4");
dns.on("message", (msg, rinfo) => {
  const q = dnsPacket.decode(msg);
  const name = (q.questions[0] && q.questions[0].name || "").toLowerCase();
  const ip = names[name];
  const answers = ip && q.questions[0].type === "A" ? [{ type: "A", name, ttl: 5, data: ip }] : [];
  const rcode = ip ? 0 : 3;
  dns.send(dnsPacket.encode({ type: "response", id: q.id, flags: 0x0100 | 0x0080 | rcode, questions: q.questions, answers }), rinfo.port, rinfo.address);
});
dns.bind(53, "${WORLD.dns}", up);
`;

function sh(script: string): void {
  execFileSync("sh", ["-c", script], { stdio: ["ignore", "ignore", "pipe"] });
}

export class OutsideWorld {
  readonly tag = randomBytes(2).toString("hex");
  readonly netns = `wworld-${this.tag}`;
  readonly hostVeth = `wwh${this.tag}`;
  private readonly dir = mkdtempSync(join(tmpdir(), "warren-world-"));
  private server: ChildProcess | undefined;

  async start(): Promise<void> {
    const key = join(this.dir, "key.pem");
    const cert = join(this.dir, "cert.pem");
    execFileSync(
      "openssl",
      ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test.warren"]
        .concat(["-addext", "subjectAltName=DNS:*.test.warren,DNS:a.test.warren,DNS:b.test.warren"])
        .concat(["-keyout", key, "-out", cert]),
      { stdio: "ignore" },
    );
    sh(`set -e
ip netns add ${this.netns}
ip link add ${this.hostVeth} type veth peer name eth0 netns ${this.netns}
ip addr add 198.18.0.1/24 dev ${this.hostVeth}
ip link set ${this.hostVeth} up
# Replies to sandboxes come in here and are forwarded to their veth.
sysctl -qw net.ipv4.conf.${this.hostVeth}.forwarding=1
ip route add 198.18.1.0/24 via 198.18.0.2 dev ${this.hostVeth}
ip route add 198.18.2.0/24 via 198.18.0.2 dev ${this.hostVeth}
ip -n ${this.netns} link set lo up
ip -n ${this.netns} addr add 198.18.0.2/24 dev eth0
ip -n ${this.netns} addr add ${WORLD.dns}/32 dev eth0
ip -n ${this.netns} addr add ${WORLD.serverA}/32 dev eth0
ip -n ${this.netns} addr add ${WORLD.serverB}/32 dev eth0
ip -n ${this.netns} link set eth0 up
ip -n ${this.netns} route add default via 198.18.0.1
`);
    const script = join(this.dir, "world.cjs");
    writeFileSync(script, SERVER_SCRIPT);
    const require = createRequire(import.meta.url);
    this.server = spawn("ip", ["netns", "exec", this.netns, process.execPath, script], {
      env: {
        ...process.env,
        DNS_PACKET: require.resolve("dns-packet"),
        NAMES: JSON.stringify(WORLD.names),
        KEY: key,
        CERT: cert,
      },
      stdio: ["ignore", "pipe", "inherit"],
    });
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("outside world did not start")), 15_000);
      this.server?.stdout?.on("data", (chunk: Buffer) => {
        if (chunk.toString().includes("ready")) {
          clearTimeout(timer);
          resolve();
        }
      });
      this.server?.once("exit", (code) => reject(new Error(`outside world exited (${code})`)));
    });
  }

  /** `ip:port` of the world's DNS server (the node agent's WARREN_DNS_UPSTREAM). */
  get dnsUpstream(): string {
    return `${WORLD.dns}:53`;
  }

  async stop(): Promise<void> {
    this.server?.kill("SIGKILL");
    try {
      sh(`ip link del ${this.hostVeth} 2>/dev/null; ip netns del ${this.netns} 2>/dev/null; true`);
    } finally {
      rmSync(this.dir, { recursive: true, force: true });
    }
  }
}
