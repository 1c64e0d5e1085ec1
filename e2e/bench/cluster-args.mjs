// What a benchmark's command line says about its cluster, shared by the benchmarks that take it.

/**
 * `--env NAME=VALUE` (repeatable): settings of the cluster's processes, for A/B runs in one session, e.g.
 * `--env WARREN_POOL_REFILL_DELAY_MS=0`.
 */
export function clusterEnvFromArgs(argv = process.argv) {
  const env = {};
  argv.forEach((arg, i) => {
    if (arg !== "--env") return;
    const [name, ...value] = (argv[i + 1] ?? "").split("=");
    if (name) env[name] = value.join("=");
  });
  return env;
}

/** `--separate-master`: the api and the master as two processes (as on several hosts) instead of `warren up`'s one. */
export function clusterLayoutFromArgs(argv = process.argv) {
  return argv.includes("--separate-master") ? { separateMaster: true } : {};
}
