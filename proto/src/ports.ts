/**
 * The ports every sandbox serves, fixed by E2B's SDKs (they build `<port>-<sandboxId>.<domain>` from them): envd's
 * on 49983, the code gateway's (code templates) on 49999. Written once here; everything else imports them.
 */
export const ENVD_PORT = 49983;
export const CODE_GATEWAY_PORT = 49999;
