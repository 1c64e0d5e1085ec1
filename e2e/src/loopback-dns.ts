/**
 * `node --import <this file>`: name resolution for a test client, so it can use a wildcard domain without DNS.
 * `WARREN_LOOPBACK_DOMAIN` and every name under it resolve to `WARREN_LOOPBACK_ADDRESS` (a 127.x.y.z address);
 * `localhost` resolves as usual; every other name fails with ENOTFOUND, so nothing the client does can leave the
 * machine. Node's net/tls (and with them fetch and undici) resolve through `dns.lookup`, which this replaces.
 */
import dns, { type LookupAddress, type LookupOptions } from "node:dns";
import { isIP } from "node:net";

const domain = (process.env.WARREN_LOOPBACK_DOMAIN ?? "").toLowerCase();
const address = process.env.WARREN_LOOPBACK_ADDRESS ?? "";
if (!domain || !address.startsWith("127.") || isIP(address) !== 4) {
  throw new Error(
    `loopback-dns needs WARREN_LOOPBACK_DOMAIN and a 127.x.y.z WARREN_LOOPBACK_ADDRESS, got '${domain}', '${address}'`,
  );
}

type Callback = (error: NodeJS.ErrnoException | null, address?: string | LookupAddress[], family?: number) => void;
type Lookup = (hostname: string, options: LookupOptions | number | Callback, callback?: Callback) => void;

const systemLookup = dns.lookup as unknown as Lookup;

function answer(hostname: string): string | undefined {
  const name = hostname.toLowerCase().replace(/\.$/, "");
  if (name === domain || name.endsWith(`.${domain}`)) return address;
  if (isIP(name) !== 0) return name;
  return undefined;
}

const loopbackLookup: Lookup = (hostname, options, callback) => {
  const done = (typeof options === "function" ? options : callback) as Callback;
  const opts: LookupOptions = typeof options === "object" ? options : {};
  if (hostname.toLowerCase() === "localhost") {
    systemLookup(hostname, opts, done);
    return;
  }
  const found = answer(hostname);
  if (found === undefined) {
    const error: NodeJS.ErrnoException = new Error(`getaddrinfo ENOTFOUND ${hostname} (loopback-dns)`);
    error.code = "ENOTFOUND";
    process.nextTick(done, error);
    return;
  }
  const family = isIP(found);
  if (opts.all) process.nextTick(done, null, [{ address: found, family }]);
  else process.nextTick(done, null, found, family);
};

dns.lookup = loopbackLookup as unknown as typeof dns.lookup;
dns.promises.lookup = ((hostname: string, options: LookupOptions = {}) =>
  new Promise((resolve, reject) =>
    loopbackLookup(hostname, options, (error, found, family) => {
      if (error) reject(error);
      else resolve(Array.isArray(found) ? found : { address: found as string, family: family as number });
    }),
  )) as typeof dns.promises.lookup;
