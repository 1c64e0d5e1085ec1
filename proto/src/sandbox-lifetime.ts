/**
 * E2B's sandbox lifetimes, written once: the api applies them to requests that name none, the master to a request
 * that carries 0 (a caller that skipped the api's defaults), the SDKs document them.
 */

/** `POST /v2/sandboxes` and v2 `connect` without a timeout: five minutes, as E2B's. */
export const DEFAULT_SANDBOX_TIMEOUT_SECONDS = 300;

/** `POST /sandboxes` (E2B's v1 create) without a timeout. */
export const V1_CREATE_DEFAULT_TIMEOUT_SECONDS = 15;
