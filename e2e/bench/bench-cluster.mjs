// What every whole-cluster benchmark's cluster shares.

/**
 * A benchmark measures this machine, it does not change it: no uplink forwarding, sandbox DNS to nowhere. Spread
 * into a LocalCluster's `env`, before a benchmark's own settings.
 */
export const QUIET_CLUSTER_ENV = Object.freeze({ WARREN_UPLINK_FORWARDING: "0", WARREN_DNS_UPSTREAM: "127.0.0.1:9" });

/** Points the official SDKs (which read their settings from the environment) at a started cluster. */
export function useClusterForSdk(env) {
  Object.assign(process.env, {
    E2B_API_URL: env.E2B_API_URL,
    E2B_SANDBOX_URL: env.E2B_SANDBOX_URL,
    E2B_API_KEY: env.E2B_API_KEY,
  });
}
