/**
 * Tests of E2B's suites that e2b-suites.mjs does not run, each with why. `file` is relative to the suite's package
 * (a `/**` suffix: a folder); `test`, when given, is a test's name (its full name ends with it) and skips only
 * that test; `modes` lists where the exclusion applies. README.md ("E2B's own test suites") lists the same.
 */
const both = ["url", "domain"];

const RUNTIMES = "other JS runtimes (browser, Bun, Deno, Cloudflare workerd): E2B runs them with their own configs";
/** Unit tests of the SDK itself: they import modules the npm package does not export, or mock its internals. */
const SDK_INTERNALS = "unit test of SDK internals the npm package does not export (reaches no server)";
/** msw answers every request in the process: these test the SDK's requests, not a server. */
const MOCKED = "mocks the API with msw (reaches no server)";
const INTERNET = "reaches the public internet from inside the sandbox (1.1.1.1, 8.8.8.8, e2b.dev)";
/** URL mode routes by headers the SDK adds to its own requests; a test that fetches a sandbox URL itself has none. */
const NEEDS_DOMAIN =
  "fetches https://<port>-<id>.<domain> (or a signed file URL) itself: needs the wildcard domain; runs in domain mode";

const offline = (file, reason) => ({ suite: "js-sdk", file, modes: both, reason });
const oneTest = (file, test, reason, modes = both) => ({ suite: "js-sdk", file, test, modes, reason });

export const EXCLUDED = [
  { suite: "js-sdk", file: "tests/runtimes/**", modes: both, reason: RUNTIMES },
  { suite: "code-interpreter", file: "tests/runtimes/**", modes: both, reason: RUNTIMES },
  offline("tests/bundle/**", "inspects the SDK's own build output (dist/), not a server"),
  offline("tests/api/handleApiError.test.ts", SDK_INTERNALS),
  offline("tests/api/http2.test.ts", SDK_INTERNALS),
  offline("tests/api/inflight.test.ts", SDK_INTERNALS),
  offline("tests/api/validateApiKey.test.ts", SDK_INTERNALS),
  offline("tests/connectionConfig.test.ts", SDK_INTERNALS),
  offline("tests/connectionConfig.browser.test.ts", SDK_INTERNALS),
  offline("tests/envd/handleEnvdApiError.test.ts", SDK_INTERNALS),
  offline("tests/envd/handleRpcError.test.ts", SDK_INTERNALS),
  offline("tests/envd/http2.test.ts", SDK_INTERNALS),
  offline("tests/is.test.ts", SDK_INTERNALS),
  offline("tests/logs.test.ts", SDK_INTERNALS),
  offline("tests/paginator.test.ts", SDK_INTERNALS),
  offline("tests/runtime.test.ts", SDK_INTERNALS),
  offline("tests/stripAnsi.test.ts", SDK_INTERNALS),
  offline("tests/undici.test.ts", SDK_INTERNALS),
  offline("tests/utils.test.ts", SDK_INTERNALS),
  offline("tests/sandbox/commands/commandHandle.test.ts", SDK_INTERNALS),
  offline("tests/sandbox/configPropagation.test.ts", SDK_INTERNALS),
  offline("tests/sandbox/files/entryInfo.test.ts", SDK_INTERNALS),
  offline("tests/sandbox/files/watchHandle.test.ts", SDK_INTERNALS),
  offline("tests/sandbox/git/validation.test.ts", SDK_INTERNALS),
  offline("tests/sandbox/rpcHeaders.test.ts", SDK_INTERNALS),
  offline("tests/sandbox/urls.test.ts", "builds URLs from a Sandbox object made without a server"),
  offline("tests/client.test.ts", MOCKED),
  offline("tests/sandbox/abortSignal.test.ts", MOCKED),
  offline("tests/sandbox/egressProxy.test.ts", MOCKED),
  offline("tests/sandbox/iam.test.ts", MOCKED),
  offline("tests/sandbox/lifecycleRequest.test.ts", MOCKED),
  offline("tests/sandbox/networkTransform.test.ts", MOCKED),
  offline("tests/secret/**", MOCKED),
  offline("tests/volume/**", MOCKED),
  offline("tests/template/abortSignal.test.ts", MOCKED),
  offline("tests/template/boundOpts.test.ts", MOCKED),
  offline("tests/template/stacktrace.test.ts", MOCKED),
  offline("tests/template/tags.test.ts", MOCKED),
  offline("tests/template/utils/**", SDK_INTERNALS),
  offline("tests/template/uploadFile.test.ts", SDK_INTERNALS),
  offline(
    "tests/template/methods/toDockerfile.test.ts",
    "converts a template to a Dockerfile in the SDK (reaches no server)",
  ),
  offline(
    "tests/template/methods/fromDockerfile.test.ts",
    "parses Dockerfiles into a template in the SDK (`FROM node:24`, never built: reaches no server)",
  ),
  oneTest(
    "tests/sandbox/fork.test.ts",
    "fork with count lower than 1 fails",
    "expects e2b@2.45's client-side check of count before any request; e2b@2.51 sends it, and the placeholder API key gets a 401 from any server",
  ),
  oneTest("tests/sandbox/internetAccess.test.ts", "internet access enabled", INTERNET),
  oneTest("tests/sandbox/internetAccess.test.ts", "internet access default", INTERNET),
  oneTest("tests/sandbox/network.test.ts", "allow specific IP with deny all traffic", INTERNET),
  oneTest("tests/sandbox/network.test.ts", "deny specific IP address", INTERNET),
  oneTest("tests/sandbox/network.test.ts", "allow takes precedence over deny", INTERNET),
  oneTest("tests/sandbox/network.test.ts", "denies a previously reachable IP after update", INTERNET),
  oneTest("tests/sandbox/network.test.ts", "omitting fields replaces all egress rules", INTERNET),
  oneTest(
    "tests/sandbox/network.test.ts",
    "injected header is reflected by the httpbin sidecar",
    "needs E2B's `httpbin` template (go-httpbin from a public registry) reachable as a public sidecar",
  ),
  oneTest("tests/sandbox/network.test.ts", "sandbox requires traffic access token", NEEDS_DOMAIN, ["url"]),
  oneTest("tests/sandbox/network.test.ts", "sandbox works without token", NEEDS_DOMAIN, ["url"]),
  oneTest("tests/sandbox/network.test.ts", "verify maskRequestHost modifies Host header correctly", NEEDS_DOMAIN, [
    "url",
  ]),
  oneTest("tests/sandbox/host.test.ts", "ping server in running sandbox", NEEDS_DOMAIN, ["url"]),
  oneTest("tests/sandbox/host.test.ts", "ping server in non-running sandbox", NEEDS_DOMAIN, ["url"]),
  oneTest("tests/sandbox/lifecyclePayload.test.ts", "auto-resume wakes paused sandbox on http request", NEEDS_DOMAIN, [
    "url",
  ]),
  oneTest("tests/sandbox/secure.test.ts", "test access file with signing", NEEDS_DOMAIN, ["url"]),
  oneTest("tests/sandbox/files/signing.test.ts", "test access file with expired signing", NEEDS_DOMAIN, ["url"]),
  oneTest("tests/sandbox/files/signing.test.ts", "test access file with valid signing", NEEDS_DOMAIN, ["url"]),
  oneTest("tests/sandbox/files/signing.test.ts", "test access file with valid signing as root", NEEDS_DOMAIN, ["url"]),
  oneTest("tests/sandbox/files/signing.test.ts", "test upload file with valid signing", NEEDS_DOMAIN, ["url"]),
  oneTest("tests/sandbox/files/signing.test.ts", "test upload file with valid signing as root user", NEEDS_DOMAIN, [
    "url",
  ]),
  oneTest("tests/sandbox/files/signing.test.ts", "test upload file with invalid signing", NEEDS_DOMAIN, ["url"]),
  oneTest("tests/sandbox/snapshot.test.ts", "pause and resume a sandbox with http server", NEEDS_DOMAIN, ["url"]),
];
