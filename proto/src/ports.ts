/**
 * The ports every sandbox serves, fixed by E2B's SDKs (they build `<port>-<sandboxId>.<domain>` from them): envd's
 * on 49983, the code gateway's (code templates) on 49999. Written once here; everything else imports them.
 */
export const ENVD_PORT = 49983;
export const CODE_GATEWAY_PORT = 49999;

/**
 * The node agent's relay (a proxy on another node reaches a sandbox through `CONNECT <sandboxAddr>:<port>` to the
 * sandbox's node agent, control-plane/src/node-agent/relay.ts and proxy/src/relay.ts): the shared secret travels
 * in RELAY_TOKEN_HEADER; a refusal after a failed dial names the errno in RELAY_ERROR_HEADER. HTTP header names
 * are case-insensitive: a reader through node:http looks them up lower-cased.
 */
export const RELAY_TOKEN_HEADER = "Warren-Relay-Token";
export const RELAY_ERROR_HEADER = "Warren-Relay-Error";
