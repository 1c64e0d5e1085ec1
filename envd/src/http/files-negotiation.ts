/** How a download is encoded; `undefined` from negotiation means nothing acceptable (406). */
export type ContentCoding = "gzip" | "identity";

interface Weighted {
  coding: string;
  quality: number;
}

function parseWeighted(item: string): Weighted {
  const [coding = "", ...params] = item.split(";").map((part) => part.trim());
  let quality = 1;
  for (const param of params) {
    const match = /^q=([0-9.]+)$/i.exec(param);
    if (match?.[1] !== undefined) {
      const value = Number(match[1]);
      if (Number.isFinite(value)) quality = value;
    }
  }
  return { coding: coding.toLowerCase(), quality };
}

export interface EncodingChoice {
  /** What the client prefers among what envd offers. */
  readonly coding: ContentCoding;
  /** Whether identity is still acceptable (it is unless refused with q=0). */
  readonly identityAllowed: boolean;
}

/**
 * E2B envd's Accept-Encoding rule: the highest-q acceptable coding wins (listing order
 * breaks ties), gzip is the only compression offered, `*` means gzip only when identity
 * is refused, and identity is implicitly fine unless refused with q=0. `undefined` means
 * nothing acceptable is left (406).
 */
export function negotiateEncoding(header: string | undefined): EncodingChoice | undefined {
  if (!header?.trim()) return { coding: "identity", identityAllowed: true };
  const offers = header
    .split(",")
    .filter((item) => item.trim())
    .map(parseWeighted)
    .sort((a, b) => b.quality - a.quality);
  const identityAllowed = !offers.some((offer) => offer.coding === "identity" && offer.quality === 0);
  for (const offer of offers) {
    if (offer.quality === 0) continue;
    if (offer.coding === "identity") return { coding: "identity", identityAllowed };
    if (offer.coding === "gzip" || offer.coding === "x-gzip") return { coding: "gzip", identityAllowed };
    if (offer.coding === "*") return { coding: identityAllowed ? "identity" : "gzip", identityAllowed };
  }
  return identityAllowed ? { coding: "identity", identityAllowed } : undefined;
}

export type RangeRequest =
  | { readonly kind: "full" }
  | { readonly kind: "partial"; readonly start: number; readonly end: number }
  | { readonly kind: "unsatisfiable" };

/**
 * A `Range: bytes=...` header against a file of `size` bytes, like Go's http.ServeContent:
 * malformed or non-overlapping ⇒ unsatisfiable (416); one range ⇒ partial (206, `end`
 * inclusive). Several ranges are answered with the whole file (200), which RFC 9110
 * allows, instead of multipart/byteranges.
 */
export function parseRange(header: string | undefined, size: number): RangeRequest {
  if (header === undefined || header === "") return { kind: "full" };
  if (!header.startsWith("bytes=")) return { kind: "unsatisfiable" };
  const ranges: Array<{ start: number; end: number }> = [];
  let overlapped = false;
  let specified = false;
  for (const spec of header.slice("bytes=".length).split(",")) {
    const text = spec.trim();
    if (text === "") continue;
    specified = true;
    const match = /^(\d*)-(\d*)$/.exec(text);
    if (!match || (match[1] === "" && match[2] === "")) return { kind: "unsatisfiable" };
    const first = match[1] ?? "";
    const last = match[2] ?? "";
    let start: number;
    let end: number;
    if (first === "") {
      const suffix = Number(last);
      if (suffix === 0) continue;
      start = Math.max(size - suffix, 0);
      end = size - 1;
    } else {
      start = Number(first);
      end = last === "" ? size - 1 : Math.min(Number(last), size - 1);
      if (last !== "" && Number(last) < start) return { kind: "unsatisfiable" };
    }
    if (start >= size || end < start) continue;
    overlapped = true;
    ranges.push({ start, end });
  }
  if (!specified) return { kind: "full" };
  if (!overlapped) return { kind: "unsatisfiable" };
  const [only] = ranges;
  if (ranges.length === 1 && only) return { kind: "partial", start: only.start, end: only.end };
  return { kind: "full" };
}
