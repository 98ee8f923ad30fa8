/**
 * Webhook signatures (compensator and notification webhooks, commands pushed to a run's
 * `resume_url`), as `clients/spec/vectors/signatures.json` specifies:
 *
 *     X-Saga-Timestamp: <unix seconds>
 *     X-Saga-Signature: sha256=<hex HMAC-SHA256(secret, timestamp + "." + raw body)>
 */
import { createHmac, timingSafeEqual } from "node:crypto";

export const SIGNATURE_HEADER = "X-Saga-Signature";
export const TIMESTAMP_HEADER = "X-Saga-Timestamp";
export const DEFAULT_TOLERANCE_S = 300;

type Bytes = string | Uint8Array;
/** Any headers: a `Headers`, a plain object (Node's `req.headers`), or `[name, value]` pairs. */
export type HeadersLike = Headers | Record<string, string | string[] | undefined> | Iterable<[string, string]>;

function asBuffer(body: Bytes): Buffer {
  return typeof body === "string" ? Buffer.from(body, "utf8") : Buffer.from(body.buffer, body.byteOffset, body.byteLength);
}

export function computeSignature(secret: string, timestamp: string | number, body: Bytes): string {
  const mac = createHmac("sha256", Buffer.from(secret, "utf8"));
  mac.update(Buffer.from(`${timestamp}.`, "utf8"));
  mac.update(asBuffer(body));
  return `sha256=${mac.digest("hex")}`;
}

/** A secret of its own for `context` (e.g. `"resume:acme:onboarding-agent"`). */
export function deriveSecret(master: string, context: string): string {
  return createHmac("sha256", Buffer.from(master, "utf8")).update(Buffer.from(context, "utf8")).digest("hex");
}

export function signedHeaders(secret: string, body: Bytes, timestamp?: number): Record<string, string> {
  const ts = String(timestamp ?? Math.floor(Date.now() / 1000));
  return { [TIMESTAMP_HEADER]: ts, [SIGNATURE_HEADER]: computeSignature(secret, ts, body) };
}

function lowered(headers: HeadersLike): Map<string, string> {
  const out = new Map<string, string>();
  const entries: Iterable<[string, unknown]> =
    typeof (headers as Headers).forEach === "function" && typeof (headers as Headers).get === "function"
      ? (headers as Headers).entries()
      : Symbol.iterator in (headers as object)
        ? (headers as Iterable<[string, string]>)
        : Object.entries(headers as Record<string, unknown>);
  for (const [name, value] of entries) {
    if (value === undefined) continue;
    out.set(String(name).toLowerCase(), Array.isArray(value) ? String(value[0] ?? "") : String(value));
  }
  return out;
}

export interface VerifyOptions {
  /** Seconds a signature stays valid either way of now (default 300). */
  toleranceS?: number;
  /** Now, in unix seconds (tests). */
  now?: number;
  /** The URL this endpoint was registered as (a run's `resume_url`): the signed body must name it. */
  url?: string | null;
}

/**
 * True when the request was signed with `secret` within `toleranceS` of now (either way) over
 * exactly these bytes — and, with `url`, its body is a JSON object whose `"url"` names that
 * destination (scheme and host without regard to case, a default port the same as none, the
 * fragment ignored; path and query exactly). Compare before parsing the body.
 */
export function verifySignature(secret: string, headers: HeadersLike, rawBody: Bytes, options: VerifyOptions = {}): boolean {
  const map = lowered(headers);
  const timestamp = (map.get(TIMESTAMP_HEADER.toLowerCase()) ?? "").trim();
  const signature = (map.get(SIGNATURE_HEADER.toLowerCase()) ?? "").trim();
  if (!/^[0-9]+$/.test(timestamp) || !signature) return false;
  const now = options.now ?? Date.now() / 1000;
  if (Math.abs(now - Number(timestamp)) > (options.toleranceS ?? DEFAULT_TOLERANCE_S)) return false;
  const expected = Buffer.from(computeSignature(secret, timestamp, rawBody), "utf8");
  const given = Buffer.from(signature, "utf8");
  if (expected.length !== given.length || !timingSafeEqual(expected, given)) return false;
  return options.url == null || namesDestination(asBuffer(rawBody), options.url);
}

function namesDestination(body: Buffer, url: string): boolean {
  let payload: unknown;
  try {
    payload = JSON.parse(body.toString("utf8"));
  } catch {
    return false;
  }
  const named =
    payload !== null && typeof payload === "object" && !Array.isArray(payload)
      ? (payload as Record<string, unknown>)["url"]
      : undefined;
  if (typeof named !== "string") return false;
  const expected = destination(url);
  return expected !== null && expected === destination(named);
}

const DEFAULT_PORTS: Record<string, string> = { "http:": "80", "https:": "443" };

/** A URL as the request it sends: scheme, host, port (none for the default) and path with query. */
function destination(url: string): string | null {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return null;
  }
  if (!(parsed.protocol in DEFAULT_PORTS) || !parsed.hostname) return null;
  const host = parsed.hostname.toLowerCase().replace(/\.$/, "");
  const port = parsed.port === DEFAULT_PORTS[parsed.protocol] ? "" : parsed.port;
  return JSON.stringify([parsed.protocol, host, port, parsed.pathname + parsed.search]);
}
