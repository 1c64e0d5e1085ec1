import { Headers as FetchFreeHeaders } from "headers-polyfill";

/**
 * Gives envd a `Headers` class that does not come with Node.js's fetch implementation. Connect's server (request
 * and response metadata, errors) needs `Headers` and nothing else of the fetch API, but Node.js's global is a lazy
 * getter that loads all of undici at first use: 20 ms of CPU and ~2 MiB of heap in every sandbox's envd (its
 * warm-up or first call), measured on 2026-12-05. Imported first by services.ts, so it is in place before Connect's
 * modules load (envd's front, server.ts, needs no `Headers`); envd's processes never see it (they are other programs).
 */
function useFetchFreeHeaders(): void {
  Object.defineProperty(globalThis, "Headers", {
    value: FetchFreeHeaders,
    writable: true,
    configurable: true,
    enumerable: false,
  });
}

useFetchFreeHeaders();
