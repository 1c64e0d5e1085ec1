// A reference point, not Warren: the smallest Node.js proxy built on undici's client (one keep-alive
// Pool to one upstream, responses streamed with backpressure) behind the same node:http server Warren
// uses. It shows what replacing node:http's client (http.Agent + ClientRequest) alone would buy.
import { createServer } from "node:http";
import { Pool } from "undici";

const [, , target] = process.argv;
const pool = new Pool(target, { connections: null, pipelining: 1, headersTimeout: 0, bodyTimeout: 0 });
const HOP_BY_HOP = new Set(["connection", "keep-alive", "transfer-encoding", "upgrade", "expect", "te", "trailer"]);

const server = createServer({ noDelay: true }, (req, res) => {
  const headers = [];
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    if (!HOP_BY_HOP.has(req.rawHeaders[i].toLowerCase())) headers.push(req.rawHeaders[i], req.rawHeaders[i + 1]);
  }
  let abort;
  res.once("close", () => {
    if (!res.writableFinished) abort?.();
  });
  pool.dispatch(
    { path: req.url, method: req.method, headers, body: req.method === "GET" || req.method === "HEAD" ? null : req },
    {
      onConnect(abortRequest) {
        abort = abortRequest;
      },
      onHeaders(status, raw, resume, statusText) {
        const out = [];
        for (let i = 0; i < raw.length; i += 2) {
          const name = raw[i].toString("latin1");
          if (!HOP_BY_HOP.has(name.toLowerCase())) out.push(name, raw[i + 1].toString("latin1"));
        }
        res.writeHead(status, statusText, out);
        res.on("drain", resume);
        return true;
      },
      onData(chunk) {
        return res.write(chunk);
      },
      onComplete() {
        res.end();
      },
      onError() {
        if (res.headersSent) res.destroy();
        else res.writeHead(502).end();
      },
    },
  );
});
server.listen(0, "127.0.0.1", () => process.stdout.write(`${server.address().port}\n`));
process.on("SIGTERM", () => process.exit(0));
