/**
 * Requests and answers: one API call with retries (the same idempotency key on every attempt, so a
 * retry can never do a thing twice), and one function per endpoint. The retry rule is the spec's
 * (`clients/spec/errors.json`, `retry`), the same as the Python client's.
 */
import { RETRY_CODES, RETRY_STATUS } from "./generated/codes.js";
import { SagaConfigError, SagaError, SagaUnavailable, errorFromAnswer } from "./errors.js";

/** The header with which the server marks an answer replayed from an earlier request's record. */
export const REPLAYED_HEADER = "Idempotent-Replayed";

export interface Settings {
  /** Attempts after the first for what may be repeated (default 4). */
  retries: number;
  /** First backoff, seconds (default 0.2), doubling up to `maxBackoffS` (5), with jitter. */
  backoffS: number;
  maxBackoffS: number;
  /** Per-request timeout, seconds (default 10). */
  timeoutS: number;
  /** Approval polling: from `pollIntervalS` (2) backing off to `maxPollIntervalS` (30). */
  pollIntervalS: number;
  maxPollIntervalS: number;
  /** How long a step waits for a person by default (3600 s). */
  approvalTimeoutS: number;
}

export interface Reply<T = unknown> {
  status: number;
  data: T;
  /** The request was sent again after a transport error: its first send may have reached the server. */
  resent: boolean;
  /** The server answered from its idempotency record: an earlier request with this key acted. */
  replayed: boolean;
  /** The answer's headers (its `ETag`, say). */
  headers?: Headers;
}

export interface RequestOptions {
  body?: unknown;
  query?: Record<string, string | number | undefined | null>;
  idempotencyKey?: string;
  /** A write that is harmless to repeat (a heartbeat). */
  retrySafe?: boolean;
  signal?: AbortSignal | undefined;
  /** More request headers (`If-None-Match`). */
  headers?: Record<string, string>;
}

/**
 * The `url` and `key` a client was given, refused with `SagaConfigError` naming the option when it
 * could never work: a missing or empty value (typically an unset environment variable passed on,
 * `process.env.SAGA_URL`), or a URL that does not parse or is not http(s). Without this, an unset
 * URL would fail at the first call with a `TypeError`, and an unparsable one be retried as an
 * unreachable server.
 */
export function checkConnection(url: unknown, key: unknown): void {
  if (typeof url !== "string" || url.trim() === "") {
    throw new SagaConfigError(
      "url",
      `Saga: the server's URL (option \`url\`) is ${describeValue(url)}: pass it, e.g. \`new Saga({ url: process.env.SAGA_URL, ... })\` ` +
        "with SAGA_URL set to https://saga.example.com.",
    );
  }
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new SagaConfigError(
      "url",
      `Saga: the server's URL (option \`url\`, e.g. SAGA_URL) ${JSON.stringify(url)} is not a URL: give it with its scheme and host, e.g. https://saga.example.com.`,
    );
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    throw new SagaConfigError(
      "url",
      `Saga: the server's URL (option \`url\`, e.g. SAGA_URL) ${JSON.stringify(url)} is not an http(s) URL: e.g. https://saga.example.com.`,
    );
  }
  if (typeof key !== "string" || key.trim() === "") {
    throw new SagaConfigError(
      "key",
      `Saga: the API key (option \`key\`) is ${describeValue(key)}: pass an agent key, e.g. \`new Saga({ key: process.env.SAGA_AGENT_KEY, ... })\` ` +
        "with SAGA_AGENT_KEY set (manage.py create_agent_key --tenant SLUG --name NAME).",
    );
  }
}

function describeValue(value: unknown): string {
  if (value === undefined) return "undefined (not set)";
  if (value === null) return "null";
  if (typeof value === "string") return "empty";
  return `a ${typeof value}, not a string`;
}

export function apiRoot(url: string): string {
  const base = url.replace(/\/+$/, "");
  return base.endsWith("/api/v1") ? base : `${base}/api/v1`;
}

/** Sleep `seconds`, or until `signal` aborts (then throw its reason). */
export function sleep(seconds: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.max(0, seconds * 1000));
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

export class Http {
  readonly root: string;
  readonly settings: Settings;
  private readonly headers: Record<string, string>;
  private readonly fetchImpl: typeof fetch;

  constructor(url: string, key: string, settings: Settings, fetchImpl?: typeof fetch) {
    checkConnection(url, key);
    this.root = apiRoot(url);
    this.settings = settings;
    this.headers = {
      Authorization: `Bearer ${key}`,
      Accept: "application/json",
      "User-Agent": "saga-admin-typescript-client/1",
    };
    this.fetchImpl = fetchImpl ?? ((input, init) => fetch(input, init));
  }

  backoff(attempt: number, retryAfter: string | null): number {
    const s = this.settings;
    if (retryAfter && /^[0-9]+$/.test(retryAfter)) return Math.min(Number(retryAfter), s.maxBackoffS * 4);
    const delay = Math.min(s.backoffS * 2 ** (attempt - 1), s.maxBackoffS);
    return delay * (0.5 + Math.random() * 0.5);
  }

  /**
   * One API call with retries; the reply, or a typed `SagaError`. Retried: network errors and
   * timeouts, the spec's statuses and codes (5xx, 429 after Retry-After, 409
   * `idempotency_key_in_flight`) — for reads, writes with an idempotency key and `retrySafe` ones.
   */
  async request<T = unknown>(method: string, path: string, options: RequestOptions = {}): Promise<Reply<T>> {
    const headers: Record<string, string> = { ...this.headers, ...options.headers };
    if (options.idempotencyKey) headers["Idempotency-Key"] = options.idempotencyKey;
    const body = options.body === undefined ? undefined : JSON.stringify(options.body);
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const safe =
      options.retrySafe === true ||
      method === "GET" ||
      options.idempotencyKey !== undefined ||
      (typeof options.body === "object" && options.body !== null && "idempotency_key" in options.body);
    let url = this.root + path;
    if (options.query) {
      const params = new URLSearchParams();
      for (const [k, v] of Object.entries(options.query)) if (v !== undefined && v !== null) params.set(k, String(v));
      const text = params.toString();
      if (text) url += `?${text}`;
    }
    let attempt = 0;
    let resent = false;
    for (;;) {
      attempt += 1;
      options.signal?.throwIfAborted();
      const timeout = AbortSignal.timeout(this.settings.timeoutS * 1000);
      const signal = options.signal ? AbortSignal.any([options.signal, timeout]) : timeout;
      let response: Response;
      let text: string;
      try {
        response = await this.fetchImpl(url, { method, headers, body: body ?? null, signal });
        // The body is read here too: a connection reset or a timeout while it arrives is a
        // transport error like one before the headers, retried by the same rule.
        text = await response.text();
      } catch (error) {
        if (options.signal?.aborted) throw options.signal.reason;
        if (!safe || attempt > this.settings.retries) {
          throw new SagaUnavailable(
            `Saga Admin did not answer ${method} ${path} (${describe(error)}) after ${attempt} attempt(s).`,
            attempt,
            { cause: error },
          );
        }
        resent = true;
        await sleep(this.backoff(attempt, null), options.signal);
        continue;
      }
      if (response.status < 400) {
        const replayed = (response.headers.get(REPLAYED_HEADER) ?? "").toLowerCase() === "true";
        return { status: response.status, data: decoded<T>(response, text), resent, replayed, headers: response.headers };
      }
      const error = errorFromAnswer(response.status, response.statusText, text, response.headers.get("X-Request-Id") ?? "");
      const retry = RETRY_STATUS.includes(response.status) || RETRY_CODES.includes(error.code);
      if (!retry || !safe || attempt > this.settings.retries) throw error;
      await sleep(this.backoff(attempt, response.headers.get("Retry-After")), options.signal);
    }
  }

  async call<T = unknown>(method: string, path: string, options: RequestOptions = {}): Promise<T> {
    return (await this.request<T>(method, path, options)).data;
  }
}

function decoded<T>(response: Response, text: string): T {
  if (!text) return null as T;
  try {
    return JSON.parse(text) as T;
  } catch {
    throw new SagaError(
      `Saga Admin answered ${response.status} with a body that is not JSON (${response.headers.get("Content-Type") ?? "no content type"}).`,
      "invalid_response",
    );
  }
}

function describe(error: unknown): string {
  if (error instanceof Error) {
    const cause = (error as { cause?: unknown }).cause;
    return cause instanceof Error ? `${error.name}: ${error.message}: ${cause.message}` : `${error.name}: ${error.message}`;
  }
  return String(error);
}
