/**
 * Why an image could not become a template rootfs. `unsupported` = the image was pulled but cannot run envd here
 * (another CPU architecture, a C library Warren's node cannot use); `failed` = anything else (registry unreachable,
 * a tool failed, the destination exists).
 */
export type ImageErrorCode =
  | "invalid_ref"
  | "not_found"
  | "unauthorized"
  | "too_large"
  | "timeout"
  | "unsupported"
  | "failed";

/** The one error type of image pulls; its message names the image and the reason, never a credential. */
export class ImageError extends Error {
  constructor(
    readonly code: ImageErrorCode,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = "ImageError";
  }
}
