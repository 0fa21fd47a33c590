// The admission client: POST /v1/admit and /v1/outcomes over fetch (openapi-fetch, typed by
// src/schema.d.ts, which `npm run generate` makes from internal/api/openapi.yaml).

import createClient from "openapi-fetch";
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
  /** The service token (ADMIT_SERVICE_TOKEN), sent as `Authorization: Bearer <token>`. */
  token: string;
  /** Milliseconds per try (5000). */
  timeoutMs?: number;
  retry?: Partial<RetryPolicy>;
  /** For tests and runtimes without a global fetch. */
  fetch?: (input: Request) => Promise<Response>;
  /** For tests: how the client waits between tries. */
  sleep?: (ms: number) => Promise<void>;
  /** For tests: a number in [0, 1), Math.random by default. */
  random?: () => number;
  /** Makes an idempotency key when the caller gives none (crypto.randomUUID). */
  newKey?: () => string | Promise<string>;
}

export type AdmitOptions = ({ account: string; apiKey?: never } | { apiKey: string; account?: never }) & {
  units?: Units;
  /** One per logical request; made when not given, and sent on every retry of this call. */
  idempotencyKey?: string;
  tool?: string;
  maxWaitMs?: number;
  estimate?: AdmitRequest["estimate"];
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

// A random UUID: Web Crypto's, global in browsers, edge runtimes, Deno, Bun and Node >= 19;
// node:crypto's on Node 18, loaded only there.
async function randomKey(): Promise<string> {
  const webCrypto = (globalThis as { crypto?: { randomUUID?: () => string } }).crypto;
  if (webCrypto?.randomUUID) return webCrypto.randomUUID();
  const { randomUUID } = await import("node:crypto");
  return randomUUID();
}

// A fetch that failed before a reply: a connection refused or reset (TypeError in every
// runtime's fetch), or this client's per-try timeout.
function isTransportError(e: unknown): boolean {
  return e instanceof TypeError || (e instanceof Error && (e.name === "TimeoutError" || e.name === "AbortError"));
}

type Reply<T> = { data?: T; error?: unknown; response: Response };

export class Client {
  private readonly http: ReturnType<typeof createClient<paths>>;
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
    this.retry = { ...defaultRetry, ...opts.retry };
    this.timeoutMs = opts.timeoutMs ?? 5000;
    this.sleep = opts.sleep ?? ((ms) => new Promise((resolve) => setTimeout(resolve, ms)));
    this.random = opts.random ?? Math.random;
    this.newKey = opts.newKey ?? randomKey;
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
    const reply = await this.send((signal) => this.http.POST("/v1/admit", { body, signal }), timeoutMs);
    const data = reply.data as AdmitAllowed;
    return {
      eventId: data.event_id,
      account: data.account,
      org: data.org,
      period: data.period,
      replayed: data.replayed === true,
      reply: data,
    };
  }

  /** Reports how an admitted request ended upstream (POST /v1/outcomes): its status and its
   * actual units. Retried like admit; an outcome is recorded once per event id. */
  async outcome(opts: OutcomeOptions): Promise<OutcomeReply> {
    const body: components["schemas"]["OutcomeRequest"] = { event_id: opts.eventId, status: opts.status };
    if (opts.units !== undefined) body.units = opts.units;
    const reply = await this.send((signal) => this.http.POST("/v1/outcomes", { body, signal }), this.timeoutMs);
    return reply.data as OutcomeReply;
  }

  // send makes one try after another of the same request (the same body, hence the same
  // idempotency key) while admit could not decide, and throws the typed error of a refusal.
  private async send<T>(attempt: (signal: AbortSignal) => Promise<Reply<T>>, timeoutMs: number): Promise<Reply<T>> {
    const { attempts } = this.retry;
    for (let n = 1; ; n++) {
      let reply: Reply<T>;
      try {
        reply = await attempt(AbortSignal.timeout(timeoutMs));
      } catch (e) {
        if (!isTransportError(e) || n >= attempts) throw e;
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
      throw errorFor(response.status, reply.error, retryAfter) satisfies MetergateError;
    }
  }
}
