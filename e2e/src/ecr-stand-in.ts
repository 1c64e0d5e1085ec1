import { createHash, createHmac } from "node:crypto";
import { createServer, type IncomingMessage, type Server } from "node:http";

/**
 * A loopback stand-in for ECR's `GetAuthorizationToken` (AWS's JSON 1.1 protocol), for tests that cannot reach
 * AWS: it checks the request's SigV4 signature with the secret key it was given (service `ecr`, the region the
 * keys were sent with) and answers the registry login `user:password` in base64 as ECR does; a key it does not
 * know gets ECR's `UnrecognizedClientException` (400), a wrong signature `InvalidSignatureException` (403).
 */
export interface EcrStandIn {
  readonly url: string;
  /** Requests it answered with a login. */
  readonly logins: number;
  close(): Promise<void>;
}

export interface EcrAccount {
  readonly accessKeyId: string;
  readonly secretAccessKey: string;
  readonly region: string;
  /** The registry login it hands out. */
  readonly login: { readonly username: string; readonly password: string };
}

const TARGET = "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken";

export async function startEcrStandIn(account: EcrAccount): Promise<EcrStandIn> {
  let logins = 0;
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      const refuse = (status: number, type: string, message: string) => {
        res.writeHead(status, { "content-type": "application/x-amz-json-1.1", "x-amzn-errortype": type });
        res.end(JSON.stringify({ __type: type, message }));
      };
      if (req.method !== "POST" || req.headers["x-amz-target"] !== TARGET) {
        refuse(400, "UnknownOperationException", "only GetAuthorizationToken is served here");
        return;
      }
      const auth = parseAuthorization(req.headers.authorization ?? "");
      if (!auth || auth.accessKeyId !== account.accessKeyId) {
        refuse(400, "UnrecognizedClientException", "The security token included in the request is invalid.");
        return;
      }
      if (
        auth.region !== account.region ||
        auth.service !== "ecr" ||
        auth.signature !== signature(req, body, auth, account)
      ) {
        refuse(
          403,
          "InvalidSignatureException",
          "The request signature we calculated does not match the signature you provided.",
        );
        return;
      }
      logins++;
      const token = Buffer.from(`${account.login.username}:${account.login.password}`).toString("base64");
      res.writeHead(200, { "content-type": "application/x-amz-json-1.1" });
      res.end(
        JSON.stringify({
          authorizationData: [
            {
              authorizationToken: token,
              expiresAt: Date.now() / 1000 + 12 * 3600,
              proxyEndpoint: "https://ecr.invalid",
            },
          ],
        }),
      );
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${port}`,
    get logins() {
      return logins;
    },
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

interface Authorization {
  readonly accessKeyId: string;
  readonly date: string;
  readonly region: string;
  readonly service: string;
  readonly signedHeaders: readonly string[];
  readonly signature: string;
}

/** `AWS4-HMAC-SHA256 Credential=<key>/<date>/<region>/<service>/aws4_request, SignedHeaders=a;b, Signature=<hex>`. */
function parseAuthorization(header: string): Authorization | undefined {
  const match =
    /^AWS4-HMAC-SHA256 Credential=([^/]+)\/(\d{8})\/([^/]+)\/([^/]+)\/aws4_request, ?SignedHeaders=([^,]+), ?Signature=([0-9a-f]{64})$/.exec(
      header,
    );
  if (!match) return undefined;
  const [, accessKeyId, date, region, service, signed, sig] = match as unknown as string[];
  return {
    accessKeyId: accessKeyId as string,
    date: date as string,
    region: region as string,
    service: service as string,
    signedHeaders: (signed as string).split(";"),
    signature: sig as string,
  };
}

const sha256 = (data: string | Buffer) => createHash("sha256").update(data).digest("hex");
const hmac = (key: string | Buffer, data: string) => createHmac("sha256", key).update(data).digest();

/** The SigV4 signature of the request as AWS computes it (canonical request → string to sign → derived key). */
function signature(req: IncomingMessage, body: Buffer, auth: Authorization, account: EcrAccount): string {
  const url = new URL(req.url ?? "/", "http://stand-in");
  const headers = auth.signedHeaders.map(
    (name) =>
      `${name}:${String(req.headers[name] ?? "")
        .trim()
        .replace(/\s+/g, " ")}\n`,
  );
  const canonical = [
    req.method,
    url.pathname,
    [...url.searchParams]
      .sort()
      .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`)
      .join("&"),
    headers.join(""),
    auth.signedHeaders.join(";"),
    sha256(body),
  ].join("\n");
  const scope = `${auth.date}/${auth.region}/${auth.service}/aws4_request`;
  const toSign = ["AWS4-HMAC-SHA256", String(req.headers["x-amz-date"]), scope, sha256(canonical)].join("\n");
  const key = hmac(
    hmac(hmac(hmac(`AWS4${account.secretAccessKey}`, auth.date), auth.region), auth.service),
    "aws4_request",
  );
  return createHmac("sha256", key).update(toSign).digest("hex");
}
