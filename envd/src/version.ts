/**
 * The E2B envd version whose features this envd fully implements. The e2b SDK gates
 * features on it (E2B-PROTOCOL.md §1.6); 0.6.4 is the last gate (watchDir
 * allowNetworkMounts), and everything up to it is implemented and tested here.
 */
export const ENVD_VERSION = "0.6.4";
