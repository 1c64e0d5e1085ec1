import { Code, ConnectError, type ConnectRouter, type Interceptor } from "@connectrpc/connect";
import {
  createAsyncIterable,
  readAllBytes,
  type UniversalHandler,
  type UniversalServerResponse,
} from "@connectrpc/connect/protocol";
import { codeToHttpStatus, errorFromJsonBytes, errorToJsonBytes } from "@connectrpc/connect/protocol-connect";
import { type EnvdError, invalidArgument } from "./errors.js";

/**
 * connect-es files some requests it cannot decode as `internal`: a body that is not valid
 * protobuf binary ("parse binary: …", while the same mistake in JSON is `invalid_argument`),
 * a corrupt or truncated compressed body, a message flagged compressed without an encoding.
 * connect-go, which E2B's envd runs on, answers `invalid_argument` for the first two. The
 * adapters below give all three the JSON codec's answer: one for unary calls, whose body is
 * decoded before interceptors run, one for streams, whose messages are decoded as read.
 */
const BINARY_PARSE_PREFIX = "parse binary: ";
const DECOMPRESSION_FAILED = "decompression failed";
const COMPRESSED_WITHOUT_ENCODING = "received compressed envelope, but do not know how to decompress";

/** The `invalid_argument` error for one of connect-es' request decode errors, else undefined. */
export function requestDecodeError(error: ConnectError, typeName: string): EnvdError | undefined {
  if (error.code !== Code.Internal) return undefined;
  const message = error.rawMessage;
  if (message.startsWith(BINARY_PARSE_PREFIX)) {
    return invalidArgument(
      `cannot decode message ${typeName} from binary: ${message.slice(BINARY_PARSE_PREFIX.length)}`,
    );
  }
  if (message === DECOMPRESSION_FAILED) {
    return invalidArgument(`cannot decompress the ${typeName} message: it is truncated or corrupt`);
  }
  if (message === COMPRESSED_WITHOUT_ENCODING) {
    return invalidArgument(`a ${typeName} message is flagged compressed but the request names no encoding`);
  }
  return undefined;
}

async function* relabelled<T>(messages: AsyncIterable<T>, typeName: string): AsyncGenerator<T> {
  try {
    yield* messages;
  } catch (error) {
    throw (error instanceof ConnectError && requestDecodeError(error, typeName)) || error;
  }
}

/** For streaming calls: a request message that fails to decode is `invalid_argument`. */
export const streamDecodeErrors: Interceptor = (next) => (req) => {
  if (!req.stream) return next(req);
  return next({ ...req, message: relabelled(req.message, req.method.input.typeName) });
};

/** A unary Connect error response is one small JSON body; 500 is what `internal` maps to. */
async function relabelUnaryResponse(
  response: UniversalServerResponse,
  typeName: string,
): Promise<UniversalServerResponse> {
  const { body, header } = response;
  if (response.status !== 500 || body === undefined || header?.has("content-encoding")) return response;
  const bytes = await readAllBytes(body, Number.MAX_SAFE_INTEGER);
  const unchanged = { ...response, body: createAsyncIterable([bytes]) };
  const wire = errorFromJsonBytes(bytes, undefined, new ConnectError("", Code.Unknown));
  const error = requestDecodeError(wire, typeName);
  if (!error) return unchanged;
  // EnvdError has ConnectError's shape, which `from` recognises and returns as is.
  const relabelledBody = errorToJsonBytes(ConnectError.from(error), undefined);
  const relabelledHeader = new Headers(header);
  relabelledHeader.set("content-length", String(relabelledBody.byteLength));
  return {
    ...response,
    status: codeToHttpStatus(error.code),
    header: relabelledHeader,
    body: createAsyncIterable([relabelledBody]),
  };
}

function unaryDecodeErrors(handler: UniversalHandler): UniversalHandler {
  const typeName = handler.method.input.typeName;
  const wrapped = async (request: Parameters<UniversalHandler>[0]) =>
    relabelUnaryResponse(await handler(request), typeName);
  return Object.assign(wrapped, {
    protocolNames: handler.protocolNames,
    service: handler.service,
    method: handler.method,
    requestPath: handler.requestPath,
    allowedMethods: handler.allowedMethods,
    supportedContentType: handler.supportedContentType,
  });
}

/**
 * Wraps the router's unary handlers; call it last in `routes`, since the Node adapter reads
 * `router.handlers` once that callback returns.
 */
export function relabelUnaryDecodeErrors(router: ConnectRouter): void {
  const handlers = router.handlers;
  for (let i = 0; i < handlers.length; i++) {
    const handler = handlers[i] as UniversalHandler;
    if (handler.method.methodKind === "unary") handlers[i] = unaryDecodeErrors(handler);
  }
}
