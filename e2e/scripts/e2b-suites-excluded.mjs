/**
 * Tests of E2B's suites that e2b-suites.mjs does not run, each with why. `file` is relative to the suite's package
 * (a `/**` suffix: a folder); `test`, when given, is a test's full name (or an unambiguous part of it) and skips
 * only that test; `modes` lists where the exclusion applies. README.md ("E2B's own test suites") lists the same.
 */
const both = ["url", "domain"];

export const EXCLUDED = [
  // Whole folders that are not tests of a server.
  {
    suite: "js-sdk",
    file: "tests/runtimes/**",
    modes: both,
    reason:
      "other JS runtimes (browser, Bun, Deno, Cloudflare workerd): E2B runs them with their own configs and tools",
  },
  {
    suite: "code-interpreter",
    file: "tests/runtimes/**",
    modes: both,
    reason: "other JS runtimes (browser, Bun, Deno): E2B runs them with their own configs and tools",
  },
  {
    suite: "js-sdk",
    file: "tests/bundle/**",
    modes: both,
    reason: "inspects the SDK's own build output (dist/), not a server",
  },
];
