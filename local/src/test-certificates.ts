import { execFileSync } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

/** PEM files of a throwaway CA and the wildcard certificate it signed (tests, and trying E2B_DOMAIN mode locally). */
export interface TestCertificates {
  /** The CA certificate: what a client trusts (NODE_EXTRA_CA_CERTS). */
  readonly caFile: string;
  /** `*.<domain>` and `<domain>`, signed by the CA, with its key: what the proxy serves. */
  readonly certFile: string;
  readonly keyFile: string;
}

/**
 * Makes a CA and a server certificate for `*.<domain>` under `dir` with the openssl CLI (P-256 keys, valid two
 * days). Node has no API that signs certificates; openssl is part of every machine Warren runs on.
 */
export function makeTestCertificates(dir: string, domain: string): TestCertificates {
  mkdirSync(dir, { recursive: true });
  const file = (name: string) => join(dir, name);
  const openssl = (...args: string[]) => execFileSync("openssl", args, { stdio: ["ignore", "ignore", "pipe"] });
  const ecKey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
  openssl(
    "req",
    "-x509",
    ...ecKey,
    "-days",
    "2",
    "-subj",
    "/CN=Warren test CA",
    "-addext",
    "basicConstraints=critical,CA:TRUE",
    "-addext",
    "keyUsage=critical,keyCertSign,cRLSign",
    "-keyout",
    file("ca.key"),
    "-out",
    file("ca.pem"),
  );
  openssl("req", ...ecKey, "-subj", `/CN=*.${domain}`, "-keyout", file("key.pem"), "-out", file("server.csr"));
  writeFileSync(
    file("server.ext"),
    [
      `subjectAltName=DNS:*.${domain},DNS:${domain}`,
      "basicConstraints=critical,CA:FALSE",
      "keyUsage=critical,digitalSignature",
      "extendedKeyUsage=serverAuth",
      "subjectKeyIdentifier=hash",
      "authorityKeyIdentifier=keyid,issuer",
      "",
    ].join("\n"),
  );
  openssl(
    "x509",
    "-req",
    "-in",
    file("server.csr"),
    "-CA",
    file("ca.pem"),
    "-CAkey",
    file("ca.key"),
    "-CAcreateserial",
    "-days",
    "2",
    "-extfile",
    file("server.ext"),
    "-out",
    file("cert.pem"),
  );
  return { caFile: file("ca.pem"), certFile: file("cert.pem"), keyFile: file("key.pem") };
}
