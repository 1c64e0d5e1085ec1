import { Readable } from "node:stream";
import busboy from "busboy";
import { type EnvdError, invalidArgument, toEnvdError } from "../errors.js";

/** One `file` part: its filename (verbatim, directories kept) and its content. */
export interface UploadPart {
  readonly filename: string | undefined;
  readonly data: Readable;
}

/** A `file` part sent as a plain form field (no filename) is held in memory, so it is capped. */
export const MAX_FIELD_FILE_BYTES = 8 * 1024 * 1024;

/**
 * Streams the `file` parts of a multipart/form-data body to `onPart`, one at a time and in
 * order (busboy holds back the next part until the current one is consumed, so memory stays
 * flat). Other parts are skipped. Resolves once every part is handled; on the first error
 * the parser is torn down and the promise rejects (the caller drains the request).
 */
export function readMultipartFiles(
  body: Readable,
  contentType: string,
  onPart: (part: UploadPart) => Promise<void>,
): Promise<void> {
  return new Promise((resolve, reject) => {
    let parser: busboy.Busboy;
    try {
      parser = busboy({
        headers: { "content-type": contentType },
        preservePath: true,
        defParamCharset: "utf8",
        limits: { fieldSize: MAX_FIELD_FILE_BYTES },
      });
    } catch (error) {
      reject(invalidArgument(`error reading multipart form: ${(error as Error).message}`));
      return;
    }
    let failed = false;
    let chain = Promise.resolve();
    const fail = (error: unknown) => {
      if (failed) return;
      failed = true;
      body.unpipe(parser);
      parser.destroy();
      // Answer only once the part being written has cleaned up after itself.
      chain.finally(() => reject(toEnvdError(error)));
    };
    const enqueue = (part: () => UploadPart) => {
      chain = chain.then(() => (failed ? undefined : onPart(part()))).catch(fail);
    };

    parser.on("file", (name, stream, info) => {
      // An error while the part waits its turn is seen by the consumer via stream state.
      stream.on("error", () => {});
      if (name !== "file" || failed) {
        stream.resume();
        return;
      }
      enqueue(() => ({ filename: info.filename, data: stream }));
    });
    parser.on("field", (name, value, info) => {
      if (name !== "file" || failed) return;
      if (info.valueTruncated) {
        fail(tooLargeField());
        return;
      }
      enqueue(() => ({ filename: undefined, data: Readable.from([Buffer.from(value, "utf8")]) }));
    });
    parser.on("error", (error: Error) => fail(invalidArgument(`error reading multipart form: ${error.message}`)));
    parser.on("finish", () => {
      chain.then(() => {
        if (!failed) resolve();
      }, fail);
    });
    if (body.errored) {
      fail(bodyError(body.errored));
      return;
    }
    body.on("error", (error: Error) => fail(bodyError(error)));
    body.on("close", () => {
      if (!body.readableEnded) fail(bodyError(new Error("the request ended before the form was complete")));
    });
    body.pipe(parser);
  });
}

function tooLargeField(): EnvdError {
  return invalidArgument(
    `multipart part 'file' without a filename is larger than ${MAX_FIELD_FILE_BYTES} bytes; send it with a filename`,
  );
}

function bodyError(error: Error): EnvdError {
  return invalidArgument(`error reading upload body: ${error.message}`);
}
