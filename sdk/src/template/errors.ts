import { TemplateError } from "../errors.js";

/**
 * Template errors with E2B's names. A BuildError (and its FileUploadError) is not a SandboxError and has no
 * `statusCode`, as in E2B; TemplateError (a SandboxError with `statusCode`) lives in `../errors.ts`.
 */

/** A template build failed: the API refused a build call, or the build itself ended in `error`. */
export class BuildError extends Error {
  constructor(message: string, stackTrace?: string) {
    super(message);
    this.name = new.target.name;
    atCaller(this, stackTrace);
  }
}

/** A COPY step's files could not be hashed, archived or uploaded. */
export class FileUploadError extends BuildError {}

export { TemplateError };

/** Points an error's stack at the user's call (the builder method that recorded the failing step). */
export function atCaller<E extends Error>(error: E, stackTrace: string | undefined): E {
  if (stackTrace) error.stack = `${error.name}: ${error.message}\n${stackTrace}`;
  return error;
}
