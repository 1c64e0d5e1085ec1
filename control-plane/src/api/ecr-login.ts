import type { AwsKeys } from "../store/template-spec.js";
import { ApiError } from "./errors.js";

/** A registry login (ECR's: user `AWS` and a token valid 12 hours). */
export interface RegistryLogin {
  readonly username: string;
  readonly password: string;
}

export type EcrLogin = (keys: AwsKeys) => Promise<RegistryLogin>;

/**
 * `fromAWSRegistry`'s keys exchanged for a registry login, as `aws ecr get-login-password` does: ECR's
 * GetAuthorizationToken, signed with the keys (SigV4) by AWS's own client, answers `AWS:<token>` in base64. The
 * token works for every ECR registry the keys may read in that region; it is made at the trigger, passed to the
 * master with it like any registry password, and never stored. `endpoint` (WARREN_ECR_ENDPOINT) replaces AWS's
 * regional endpoint: a VPC endpoint, or a loopback stand-in in tests. AWS refusing the keys answers 400 with AWS's
 * reason; ECR out of reach answers 502. AWS's client is loaded on the first use (a quarter of a second): an api
 * that never sees AWS keys never pays for it.
 */
export function ecrLogin(endpoint?: string): EcrLogin {
  return async (keys) => {
    const { ECRClient, GetAuthorizationTokenCommand } = await import("@aws-sdk/client-ecr");
    const client = new ECRClient({
      region: keys.region,
      credentials: { accessKeyId: keys.accessKeyId, secretAccessKey: keys.secretAccessKey },
      maxAttempts: 2,
      requestHandler: { connectionTimeout: 5_000, requestTimeout: 15_000 },
      ...(endpoint ? { endpoint } : {}),
    });
    try {
      const answer = await client.send(new GetAuthorizationTokenCommand({}));
      const token = answer.authorizationData?.[0]?.authorizationToken ?? "";
      const login = Buffer.from(token, "base64").toString("utf8");
      const colon = login.indexOf(":");
      if (colon < 1 || colon === login.length - 1) {
        throw new ApiError(502, `fromImageRegistry: ECR (${keys.region}) answered no usable authorization token`);
      }
      return { username: login.slice(0, colon), password: login.slice(colon + 1) };
    } catch (error) {
      if (error instanceof ApiError) throw error;
      const failure = error as {
        name?: string;
        message?: string;
        $fault?: string;
        $metadata?: { httpStatusCode?: number };
      };
      const reason = `${failure.name ?? "Error"}: ${failure.message ?? String(error)}`;
      const status = failure.$metadata?.httpStatusCode ?? 0;
      if (failure.$fault === "client" && status >= 400 && status < 500) {
        throw new ApiError(400, `fromImageRegistry: ECR (${keys.region}) refused the AWS keys: ${reason}`);
      }
      throw new ApiError(502, `fromImageRegistry: no ECR login could be had in ${keys.region}: ${reason}`);
    } finally {
      client.destroy();
    }
  };
}
