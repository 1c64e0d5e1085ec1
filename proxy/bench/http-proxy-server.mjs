// The reference point from TOOLING.md: the `http-proxy` package forwarding everything to one
// upstream. `--agent` adds a keep-alive agent; without it http-proxy sends `Connection: close`
// upstream and opens a new TCP connection for every request.
import { Agent, createServer } from "node:http";
import httpProxy from "http-proxy";

const [, , target, mode] = process.argv;
const options = { target, xfwd: false };
if (mode === "--agent") options.agent = new Agent({ keepAlive: true, maxFreeSockets: 256 });
const proxy = httpProxy.createProxyServer(options);
proxy.on("error", (_error, _req, res) => {
  if (res.writeHead && !res.headersSent) res.writeHead(502);
  res.end?.();
});
const server = createServer((req, res) => proxy.web(req, res));
server.listen(0, "127.0.0.1", () => process.stdout.write(`${server.address().port}\n`));
process.on("SIGTERM", () => process.exit(0));
