// The client of metergate's APIs over fetch, typed by src/schema.d.ts (`npm run generate`
// makes it from internal/api/openapi.yaml): admit and outcomes with their retries, and every
// other route through `api` (openapi-fetch), typed from the same document.

import createClient, { type ClientPathsWithMethod, type FetchResponse, type MaybeOptionalInit } from "openapi-fetch";
import type { components, paths } from "./schema.js";
import { errorFor, type MetergateError } from "./errors.js";

export type Units = components["schemas"]["Units"];
export type AdmitRequest = components["schemas"]["AdmitRequest"];
export type AdmitAllowed = components["schemas"]["AdmitAllowed"];
export type OutcomeReply = components["schemas"]["OutcomeReply"];

/**
 * How a request admit could not decide (503, a connection error, a timeout) is retried: with
 * the same idempotency key, so a retry is never charged twice (docs/admission.md,
 * "Idempotency"); after Retry-After when admit sends one, else after an exponential backoff
 * with full jitter.
 */
export interface RetryPolicy {
  /** Tries in all, the first included (4). */
  attempts: number;
  /** Milliseconds: the first backoff's ceiling (50). */
  baseMs: number;
  /** Milliseconds: no backoff longer than this (2000); a Retry-After up to 4 times it. */
  capMs: number;
}

export const defaultRetry: RetryPolicy = { attempts: 4, baseMs: 50, capMs: 2000 };

export interface ClientOptions {
  /** admit's address, e.g. http://127.0.0.1:8080. */
  baseUrl: string;
  /** Sent as `Authorization: Bearer <token>` on every call: the service token
   * (ADMIT_SERVICE_TOKEN) for admit, outcomes and usage; the admin token for /v1/admin; a
   * customer token (mgc_…) for /v1/portal. One client per token. */
  token: string;
  /** Milliseconds per try (5000). */
  timeoutMs?: number;
  retry?: Partial<RetryPolicy>;
  /** For tests and runtimes without a global fetch: called as fetch is, with a URL and an
   * init (admit, outcomes) or with a Request (`api`). */
  fetch?: Fetch;
  /** For tests: how the client waits between tries. */
  sleep?: (ms: number) => Promise<void>;
  /** For tests: a number in [0, 1), Math.random by default. */
  random?: () => number;
  /** Makes an idempotency key when the caller gives none (crypto.randomUUID). */
  newKey?: () => string | Promise<string>;
}

/** A fetch as the client calls it: `fetch(url, init)` or `fetch(request)`. */
export type Fetch = (input: string | Request, init?: RequestInit) => Promise<Response>;

export type AdmitOptions = ({ account: string; apiKey?: never } | { apiKey: string; account?: never }) & {
  units?: Units;
  /** One per logical request; made when not given, and sent on every retry of this call. */
  idempotencyKey?: string;
  tool?: string;
  maxWaitMs?: number;
  estimate?: AdmitRequest["estimate"];
  /** Aborts the call (and its retries), e.g. when the caller hangs up. */
  signal?: AbortSignal;
};

export interface OutcomeOptions {
  /** The event id of the admission (Admission.eventId). */
  eventId: string;
  /** The HTTP status the upstream answered. */
  status: number;
  /** The actual units, e.g. {tokens: 1170}. */
  units?: Units;
}

/** An admitted request: report its outcome with eventId. */
export interface Admission {
  eventId: string;
  account: string;
  org: string;
  period: string;
  /** True when admit answered from the idempotency record: nothing was charged now, and the
   * request must not be served twice. */
  replayed: boolean;
  reply: AdmitAllowed;
  /** The reply's headers: RateLimit and RateLimit-Policy, for the answer to the end customer. */
  headers: Headers;
}

/** Retry-After in seconds: a whole number or an HTTP date; undefined when absent or unreadable. */
export function parseRetryAfter(v: string | null, now: number = Date.now()): number | undefined {
  if (v === null || v.trim() === "") return undefined;
  const n = Number(v);
  if (Number.isFinite(n)) return Math.max(0, n);
  const t = Date.parse(v);
  return Number.isNaN(t) ? undefined : Math.max(0, (t - now) / 1000);
}

/** Milliseconds before retry number attempt (1 for the first retry). */
export function backoffMs(p: RetryPolicy, attempt: number, retryAfter: number | undefined, random: () => number): number {
  if (retryAfter !== undefined) return Math.min(retryAfter * 1000, p.capMs * 4);
  return random() * Math.min(p.capMs, p.baseMs * 2 ** (attempt - 1));
}

// A random UUID from Web Crypto: global in browsers, edge runtimes, Deno, Bun and Node >= 19.
// No node: import, so the client runs on edge runtimes as it is.
export function randomKey(): string {
  const webCrypto = (globalThis as { crypto?: { randomUUID?: () => string } }).crypto;
  if (!webCrypto?.randomUUID) throw new TypeError("no globalThis.crypto.randomUUID: give ClientOptions.newKey");
  return webCrypto.randomUUID();
}

// A fetch that failed before a reply: a connection refused or reset (TypeError in every
// runtime's fetch), or this client's per-try timeout.
function isTransportError(e: unknown): boolean {
  return e instanceof TypeError || (e instanceof Error && (e.name === "TimeoutError" || e.name === "AbortError"));
}

type Sent<T> = { data?: T; error?: unknown; response: Response };

// read reads a reply as openapi-fetch does: a success's JSON as data (none when the body is
// empty), an error's JSON (or its text) as error.
async function read(response: Response): Promise<Sent<unknown>> {
  const text = await response.text();
  if (response.ok) return { data: text === "" ? undefined : JSON.parse(text), response };
  let error: unknown = text;
  try {
    error = JSON.parse(text);
  } catch {
    // Not JSON (a proxy's page): errorFor reads no code from it.
  }
  return { error, response };
}

/** The methods of the API's routes, as openapi-fetch names them. */
export type Method = "get" | "put" | "post" | "delete" | "options" | "head" | "patch";

// Methods whose retry cannot do the work twice (RFC 9110, 9.2.2): retried like admit. POST and
// PATCH are not, except admit's and outcomes' own (one idempotency key, one event id).
const idempotent = new Set<string>(["get", "head", "options", "put", "delete"]);

type RequiredKeysOf<T> = { [K in keyof T]-?: {} extends Pick<T, K> ? never : K }[keyof T];
// openapi-fetch's InitParam: the init is optional when none of its keys is required.
type InitParam<I> = RequiredKeysOf<I> extends never ? [(I & { [key: string]: unknown })?] : [I & { [key: string]: unknown }];
type Ok<R> = Extract<R, { error?: never }>;

/** One method of `Client.api`: openapi-fetch's, whose reply is the success only (`data`,
 * `response`); an error status throws its typed error (MetergateError and kin). */
export type ApiMethod<M extends Method> = <
  P extends ClientPathsWithMethod<ReturnType<typeof createClient<paths>>, M>,
  I extends MaybeOptionalInit<paths[P], M>,
>(
  url: P,
  ...init: InitParam<I>
) => Promise<Ok<Reply<paths[P][M], I>>>;
type Reply<O, I> = O extends Record<string | number, any> ? FetchResponse<O, I, `${string}/${string}`> : never;

/**
 * Every route of the API (admin, service, portal), typed from the OpenAPI document: the path
 * and its parameters, the body, the reply's `data`. It is openapi-fetch's client with the
 * client's token, per-try timeout and retries (GET, HEAD, OPTIONS, PUT and DELETE are retried
 * like admit; POST and PATCH are sent once), and an error status thrown as its typed error.
 * No reply is validated at run time: a field or an enum value the document does not know yet
 * reaches `data` as it came.
 */
export interface Api {
  GET: ApiMethod<"get">;
  PUT: ApiMethod<"put">;
  POST: ApiMethod<"post">;
  DELETE: ApiMethod<"delete">;
  OPTIONS: ApiMethod<"options">;
  HEAD: ApiMethod<"head">;
  PATCH: ApiMethod<"patch">;
}

export class Client {
  /** Every route of the API, typed: `client.api.GET("/v1/admin/accounts/{id}", {params: {path: {id}}})`. */
  readonly api: Api;
  private readonly http: ReturnType<typeof createClient<paths>>;
  private readonly fetch: Fetch;
  private readonly baseUrl: string;
  // admit's and outcomes' headers, made once: those calls skip openapi-fetch, whose Request
  // per call cost more than the rest of the client (docs/bench.md, "The SDKs").
  private readonly headers: Record<string, string>;
  private readonly retry: RetryPolicy;
  private readonly timeoutMs: number;
  private readonly sleep: (ms: number) => Promise<void>;
  private readonly random: () => number;
  private readonly newKey: () => string | Promise<string>;

  constructor(opts: ClientOptions) {
    this.http = createClient<paths>({
      baseUrl: opts.baseUrl,
      headers: { Authorization: `Bearer ${opts.token}` },
      ...(opts.fetch ? { fetch: opts.fetch } : {}),
    });
    // The global fetch is looked up at each call and called as a function, not as a method
    // of the client (browsers refuse that).
    this.fetch = opts.fetch ?? ((input, init) => fetch(input, init));
    this.baseUrl = opts.baseUrl.replace(/\/+$/, "");
    this.headers = { Authorization: `Bearer ${opts.token}`, "Content-Type": "application/json" };
    this.retry = { ...defaultRetry, ...opts.retry };
    this.timeoutMs = opts.timeoutMs ?? 5000;
    this.sleep = opts.sleep ?? ((ms) => new Promise((resolve) => setTimeout(resolve, ms)));
    this.random = opts.random ?? Math.random;
    this.newKey = opts.newKey ?? randomKey;
    const method =
      (m: Method) =>
      (url: string, init?: Record<string, unknown>): Promise<unknown> =>
        this.call(m, url, init);
    this.api = {
      GET: method("get"),
      PUT: method("put"),
      POST: method("post"),
      DELETE: method("delete"),
      OPTIONS: method("options"),
      HEAD: method("head"),
      PATCH: method("patch"),
    } as Api;
  }

  /**
   * Asks admit to admit one request (POST /v1/admit). One idempotency key per call, made when
   * not given, is sent on every retry: a retry is never charged twice. Throws
   * RateLimitedError (429), QuotaExceededError or InsufficientBalanceError (402),
   * UnauthorizedError (401), ForbiddenError (403), UnavailableError once the retries are
   * spent, or MetergateError for any other status.
   */
  async admit(opts: AdmitOptions): Promise<Admission> {
    if ((opts.account === undefined) === (opts.apiKey === undefined)) {
      throw new TypeError("give exactly one of account and apiKey");
    }
    const body: AdmitRequest = { idempotency_key: opts.idempotencyKey ?? (await this.newKey()) };
    if (opts.account !== undefined) body.account = opts.account;
    if (opts.apiKey !== undefined) body.api_key = opts.apiKey;
    if (opts.units !== undefined) body.units = opts.units;
    if (opts.tool !== undefined) body.tool = opts.tool;
    if (opts.maxWaitMs !== undefined) body.max_wait_ms = opts.maxWaitMs;
    if (opts.estimate !== undefined) body.estimate = opts.estimate;
    // A wait in admit's queue counts against the per-try timeout.
    const timeoutMs = this.timeoutMs + (opts.maxWaitMs ?? 0);
    const reply = await this.post("/v1/admit", body, timeoutMs, opts.signal);
    const data = reply.data as AdmitAllowed;
    return {
      eventId: data.event_id,
      account: data.account,
      org: data.org,
      period: data.period,
      replayed: data.replayed === true,
      reply: data,
      headers: reply.response.headers,
    };
  }

  /** Reports how an admitted request ended upstream (POST /v1/outcomes): its status and its
   * actual units. Retried like admit; an outcome is recorded once per event id. */
  async outcome(opts: OutcomeOptions): Promise<OutcomeReply> {
    const body: components["schemas"]["OutcomeRequest"] = { event_id: opts.eventId, status: opts.status };
    if (opts.units !== undefined) body.units = opts.units;
    const reply = await this.post("/v1/outcomes", body, this.timeoutMs);
    return reply.data as OutcomeReply;
  }

  // post sends admit's and outcomes' POSTs: fetch(url, init) with the headers made once and
  // the body encoded once for every try.
  private post(path: "/v1/admit" | "/v1/outcomes", body: unknown, timeoutMs: number, caller?: AbortSignal): Promise<Sent<unknown>> {
    const url = this.baseUrl + path;
    const json = JSON.stringify(body);
    return this.send(
      async (signal) => read(await this.fetch(url, { method: "POST", headers: this.headers, body: json, signal })),
      timeoutMs,
      true,
      caller,
    );
  }

  private async call(method: Method, url: string, init: Record<string, unknown> = {}): Promise<{ data: unknown; response: Response }> {
    const caller = init["signal"] instanceof AbortSignal ? init["signal"] : undefined;
    const request = this.http.request as (m: Method, u: string, i: Record<string, unknown>) => Promise<Sent<unknown>>;
    const reply = await this.send((signal) => request(method, url, { ...init, signal }), this.timeoutMs, idempotent.has(method), caller);
    return { data: reply.data, response: reply.response };
  }

  // send makes one try after another of the same request (the same body, hence the same
  // idempotency key) while admit could not decide and the request may be retried, and throws
  // the typed error of a refusal. The caller's signal ends it, and is never retried.
  private async send<T>(
    attempt: (signal: AbortSignal) => Promise<Sent<T>>,
    timeoutMs: number,
    retryable: boolean,
    caller?: AbortSignal,
  ): Promise<Sent<T>> {
    const attempts = retryable ? this.retry.attempts : 1;
    for (let n = 1; ; n++) {
      let reply: Sent<T>;
      try {
        reply = await once(attempt, timeoutMs, caller);
      } catch (e) {
        if (caller?.aborted || !isTransportError(e) || n >= attempts) throw e;
        await this.sleep(backoffMs(this.retry, n, undefined, this.random));
        continue;
      }
      const { response } = reply;
      if (response.ok) return reply;
      const retryAfter = parseRetryAfter(response.headers.get("Retry-After"));
      if (response.status === 503 && n < attempts) {
        await this.sleep(backoffMs(this.retry, n, retryAfter, this.random));
        continue;
      }
      throw errorFor(response.status, reply.error, retryAfter, response.headers) satisfies MetergateError;
    }
  }
}

// once makes one try, aborted with a TimeoutError when its reply is not read within timeoutMs,
// or when the caller's signal aborts. A timer cleared once the reply is read costs less than
// an AbortSignal.timeout per try (docs/bench.md, "The SDKs").
async function once<T>(attempt: (signal: AbortSignal) => Promise<Sent<T>>, timeoutMs: number, caller?: AbortSignal): Promise<Sent<T>> {
  const timeout = new AbortController();
  const timer = setTimeout(() => timeout.abort(new DOMException(`no reply within ${timeoutMs} ms`, "TimeoutError")), timeoutMs);
  try {
    return await attempt(caller ? AbortSignal.any([caller, timeout.signal]) : timeout.signal);
  } finally {
    clearTimeout(timer);
  }
}
