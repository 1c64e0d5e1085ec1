// A test's `--require` hook for envd (web-headers.test.ts): on SIGUSR2, writes to stderr which of Node.js's own
// modules the process has loaded, as one JSON line.
process.on("SIGUSR2", () => {
  process.stderr.write(`LOADED-MODULES ${JSON.stringify(process.moduleLoadList)}\n`);
});
