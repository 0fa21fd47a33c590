// The middleware's core, one for every framework: admit an incoming request (or answer its
// refusal), hand the handler a Metering, report the outcome through the queue. The adapters
// (express.ts, hono.ts, handler.ts) only translate their framework's request and reply.
// Web APIs only (fetch's Request and Response, Web Crypto): it runs on edge runtimes.

import { type Admission, type Client, type Units } from "./client.js";
import { MetergateError, RateLimitedError } from "./errors.js";
import { openaiUsage, trackUsage, usageUnits, type Usage } from "./openai.js";
import { OutcomeQueue, type Logger, type QueueOptions } from "./queue.js";

/** metergate's units (docs/admission.md, "Units"). */
export const unitNames = ["requests", "tokens", "credits", "cost_micros"] as const;

/** The most of one unit a request may carry (docs/admission.md, "Maxima"). */
export const maxAmount = 1e15;

/** An incoming request as the middleware reads it: a fetch Request is one. */
export interface Incoming {
  method: string;
  url: string;
  headers: Headers;
}

/** What a resolver is given: the request, and (adapters permitting) its body, up to max
 * bytes (undefined past it, or when it cannot be read without consuming it). */
export interface IncomingRequest extends Incoming {
  readBody?: (max: number) => Promise<Uint8Array | undefined>;
}

/** A function of the incoming request (its method, URL and headers), plain or async. */
export type Resolver<T> = (req: Incoming) => T | Promise<T>;

/** What the middleware admits, per route or for all (GateOptions). */
export interface RouteOptions {
  /** The caller's metergate API key (default: bearerOrApiKey). */
  apiKey?: Resolver<string | undefined>;
  /** The account to charge: a trusted id the service resolved itself (e.g. from its own
   * session). When given, the API key is not read. */
  account?: Resolver<string | undefined>;
  /** The request's estimated units, e.g. () => ({tokens: 1000}) (default: one request). */
  units?: Resolver<Units | undefined>;
  /** A priced tool (web_search, llm_call, …): adds its credits. */
  tool?: Resolver<string | undefined>;
  /** Wait in admit's queue up to this long instead of a 429. */
  maxWaitMs?: number;
  /** Requests that are not admitted (health checks): they run without an admission. */
  skip?: (req: Incoming) => boolean;
  /**
   * The request header a caller may send so that a resend of a request already served is
   * refused 409 idempotency_key_replayed instead of being served and charged again (default
   * "Idempotency-Key"; null ignores it). It is never sent to admit as it is: the key admit
   * sees is a SHA-256 of the caller's credential, the method, the path and query, the header
   * and the body (up to maxKeyedBody; past that, or a body the adapter cannot read without
   * consuming it, the header is ignored). So a caller reusing one key for other requests is
   * served and charged for each, a resend of the same request is never served twice for one
   * charge, and no caller can collide with another's keys. Without the header each request
   * gets a fresh random key, sent on every retry of its admission and seen by nobody else.
   */
  idempotencyHeader?: string | null;
  /** Bytes of body hashed into the idempotency key at most (1 MiB). */
  maxKeyedBody?: number;
  /** The reply header that carries the event id (default "Metergate-Event-Id"; null: none). */
  eventIdHeader?: string | null;
  /** When admit cannot decide (unreachable, 5xx after the client's retries), serve the
   * request unbilled instead of answering 503 (counted in stats.unbilled). */
  failOpen?: boolean;
}

export interface GateOptions extends RouteOptions {
  /** A client made with the service token. */
  client: Client;
  /** The outcome queue, or its options (default: a queue of its own). */
  outcomes?: OutcomeQueue | QueueOptions;
  logger?: Logger;
}

/** The default API-key resolver: the token of `Authorization: Bearer <key>`, else the
 * X-API-Key header. */
export function bearerOrApiKey(req: Incoming): string | undefined {
  const auth = req.headers.get("authorization")?.trim();
  if (auth) {
    const [scheme, token] = auth.split(/\s+/, 2);
    if (scheme?.toLowerCase() === "bearer" && token) return token;
  }
  return req.headers.get("x-api-key")?.trim() || undefined;
}

/** units checked: RangeError or TypeError naming what is wrong (a unit metergate does not
 * know, an amount that is not a whole number from 0 to 10^15). */
export function checkUnits(units: Units): Units {
  const out: Record<string, number> = {};
  for (const [name, n] of Object.entries(units)) {
    if (!(unitNames as readonly string[]).includes(name)) {
      throw new TypeError(`unknown unit ${JSON.stringify(name)}: metergate's units are ${unitNames.join(", ")}`);
    }
    if (n === undefined) continue;
    if (typeof n !== "number" || !Number.isSafeInteger(n)) throw new TypeError(`units.${name} must be a whole number, not ${String(n)}`);
    if (n < 0 || n > maxAmount) throw new RangeError(`units.${name} must be from 0 to 10^15, not ${n}`);
    out[name] = n;
  }
  return out;
}

const metered = new WeakMap<object, Metering>();

/** The Metering of a request that passed the middleware (the fetch Request, Hono's
 * c.req.raw, Express's req); undefined for any other. */
export function meteringOf(req: object): Metering | undefined {
  return metered.get(req);
}

/**
 * What the middleware knows of one request, handed to its handler (res.locals.metergate,
 * c.get("metergate"), meteringOf(req)): the admission, and the actual units the handler
 * reports, which go with the outcome. admission is undefined when the request was not
 * admitted: a path skipped, or a request served unbilled by failOpen.
 */
export class Metering {
  readonly admission: Admission | undefined;
  /** The key admit saw: the hashed Idempotency-Key, or undefined for a random one. */
  readonly idempotencyKey: string | undefined;
  /** Headers for the reply: RateLimit, RateLimit-Policy, the event id. */
  readonly headers: Headers;
  private reported: Record<string, number> = {};
  private ended = false;
  private readonly queue: OutcomeQueue | undefined;

  constructor(admission?: Admission, opts: { idempotencyKey?: string; headers?: Headers; queue?: OutcomeQueue } = {}) {
    this.admission = admission;
    this.idempotencyKey = opts.idempotencyKey;
    this.headers = opts.headers ?? new Headers();
    this.queue = opts.queue;
  }

  get eventId(): string | undefined {
    return this.admission?.eventId;
  }

  /** The actual units reported so far. */
  get units(): Units {
    return { ...this.reported };
  }

  /** Adds units to what this request reports as used (call it once per model call).
   * Throws on a unit metergate does not know or an amount out of range. */
  reportUnits(units: Units): void {
    const total = { ...this.reported };
    for (const [name, n] of Object.entries(checkUnits(units))) {
      const sum = (total[name] ?? 0) + (n as number);
      if (sum > maxAmount) throw new RangeError(`units.${name} would pass 10^15 (${sum})`);
      total[name] = sum;
    }
    this.reported = total;
  }

  /** Adds a model call's tokens (openaiUsage) to the units reported. */
  reportUsage(usage: Usage | undefined): void {
    if (usage !== undefined) this.reportUnits(usageUnits(usage));
  }

  /** Reports a model response's tokens (an openai ChatCompletion, Response, …). */
  reportOpenAI(response: object | null | undefined): void {
    this.reportUsage(openaiUsage(response));
  }

  /** Passes an OpenAI stream's chunks on and reports its tokens when it ends (trackUsage). */
  track<T>(stream: AsyncIterable<T>): AsyncGenerator<T, void, undefined> {
    return trackUsage(stream, (u) => this.reportUsage(u));
  }

  /** Reports the outcome, once: the reply's status and the units reported. The adapters
   * call it when the reply is sent; later calls do nothing. */
  end(status: number): void {
    if (this.ended) return;
    this.ended = true;
    if (this.admission === undefined || this.queue === undefined) return;
    const units = this.units;
    this.queue.push({ eventId: this.admission.eventId, status, ...(Object.keys(units).length > 0 ? { units } : {}) });
  }

  /**
   * The handler's reply with this request's headers added, whose outcome is reported when
   * its body has been sent (or cancelled): a streamed reply's units are known at its end.
   * For fetch-style frameworks (Hono, Next.js); Express reports on the reply's "finish".
   * The reply to a HEAD is reported at once: its body is never sent.
   */
  finish(res: Response, method = "GET"): Response {
    const headers = new Headers(res.headers);
    this.headers.forEach((v, k) => {
      if (!headers.has(k)) headers.set(k, v);
    });
    const init = { status: res.status, statusText: res.statusText, headers };
    if (res.body === null || method === "HEAD") {
      this.end(res.status);
      return new Response(res.body, init);
    }
    const reader = res.body.getReader();
    const body = new ReadableStream<Uint8Array>({
      pull: async (ctl) => {
        try {
          const { done, value } = await reader.read();
          if (done) {
            ctl.close();
            this.end(res.status);
          } else {
            ctl.enqueue(value);
          }
        } catch (e) {
          this.end(res.status);
          ctl.error(e);
        }
      },
      cancel: async (reason) => {
        this.end(res.status);
        await reader.cancel(reason);
      },
    });
    return new Response(body, init);
  }
}

// Codes admit gives when it refuses this service's own token, not the caller's key: a
// misconfiguration of the service, which its callers should not be told is theirs.
const serviceTokenCodes = new Set(["unauthorized", "forbidden"]);
const passedHeaders = ["ratelimit", "ratelimit-policy", "retry-after"];

function json(status: number, body: unknown, headers: Record<string, string> | Headers = {}): Response {
  const h = new Headers(headers);
  h.set("content-type", "application/json");
  return new Response(JSON.stringify(body) + "\n", { status, headers: h });
}

function error(code: string, message: string): { error: { code: string; message: string } } {
  return { error: { code, message } };
}

function replyHeaders(from: Headers, retryAfter?: number): Headers {
  const h = new Headers();
  for (const name of passedHeaders) {
    const v = from.get(name);
    if (v) h.set(name, v);
  }
  if (retryAfter !== undefined && !h.has("retry-after")) h.set("retry-after", String(Math.max(0, Math.ceil(retryAfter))));
  return h;
}

const encoder = new TextEncoder();

// The key admit sees for a request whose caller sent an idempotency key: a SHA-256 of the
// credential, method, path and query, the caller's key and the body, each part ended by a
// NUL. Undefined when the body cannot be read whole.
async function keyedIdempotency(req: IncomingRequest, credential: string, given: string, maxBody: number): Promise<string | undefined> {
  const body = req.readBody ? await req.readBody(maxBody) : new Uint8Array();
  if (body === undefined) return undefined;
  const url = new URL(req.url);
  const head = encoder.encode([credential, req.method, url.pathname, url.search.replace(/^\?/, ""), given].join("\0") + "\0");
  const all = new Uint8Array(head.length + body.length);
  all.set(head);
  all.set(body, head.length);
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", all));
  let hex = "";
  for (const b of digest) hex += b.toString(16).padStart(2, "0");
  return "mw-" + hex.slice(0, 48);
}

/** The bytes of a body stream up to max; undefined (and the stream cancelled) past it. */
export async function readBounded(stream: ReadableStream<Uint8Array> | null, max: number): Promise<Uint8Array | undefined> {
  if (stream === null) return new Uint8Array();
  const reader = stream.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.length;
    if (size > max) {
      await reader.cancel();
      return undefined;
    }
    chunks.push(value);
  }
  const out = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}

/** A fetch Request as the middleware reads it; its body is read from a clone, so the
 * handler can still read it. */
export function fromRequest(req: Request): IncomingRequest {
  return {
    method: req.method,
    url: req.url,
    headers: req.headers,
    readBody: async (max) => {
      const length = Number(req.headers.get("content-length") ?? NaN);
      if (length > max || req.bodyUsed) return undefined;
      return readBounded(req.clone().body, max);
    },
  };
}

/**
 * The middleware's core: admits each request through the client, answers a refusal itself,
 * and reports the outcome of an admitted one through a bounded queue off the reply's path.
 *
 * - 429 and 402 with admit's JSON body and its RateLimit, RateLimit-Policy and Retry-After
 *   headers; 401 or 403 when admit refuses the caller's API key (401 missing_credentials
 *   when there is none); admit's other 4xx (400, 409, 422) as admit sent them.
 * - When admit cannot decide (unreachable, 5xx after the client's retries, or a refusal of
 *   the service's own token), 503 unavailable with Retry-After: 1; with failOpen (and not
 *   for a refused service token) the request is served unbilled instead.
 */
export class Gate {
  readonly client: Client;
  readonly outcomes: OutcomeQueue;
  private readonly route: RouteOptions;
  private readonly logger: Logger;

  constructor(opts: GateOptions) {
    const { client, outcomes, logger, ...route } = opts;
    this.client = client;
    this.logger = logger ?? console;
    this.outcomes = outcomes instanceof OutcomeQueue ? outcomes : new OutcomeQueue(client, { logger: this.logger, ...outcomes });
    this.route = route;
  }

  /** Waits (up to timeoutMs) for the queued outcomes to be sent: call it at shutdown. */
  flush(timeoutMs?: number): Promise<boolean> {
    return this.outcomes.flush(timeoutMs);
  }

  /**
   * Admits one request: the refusal to answer (a Response), or the Metering of a request to
   * serve. The Metering is also registered for `key` (the framework's request object, the
   * fetch Request by default), for meteringOf.
   */
  async admit(req: IncomingRequest, route: RouteOptions = {}, key?: object): Promise<Response | Metering> {
    const o = { ...this.route, ...route };
    const m = await this.decide(req, o);
    if (m instanceof Metering) metered.set(key ?? req, m);
    return m;
  }

  private async decide(req: IncomingRequest, o: RouteOptions): Promise<Response | Metering> {
    if (o.skip?.(req)) return new Metering();
    const account = o.account ? await o.account(req) : undefined;
    const apiKey = account ? undefined : await (o.apiKey ?? bearerOrApiKey)(req);
    if (!account && !apiKey) {
      return json(401, error("missing_credentials", "no API key: send Authorization: Bearer <key>"), { "www-authenticate": "Bearer" });
    }
    const units = o.units ? await o.units(req) : undefined;
    const tool = o.tool ? await o.tool(req) : undefined;
    const header = o.idempotencyHeader === undefined ? "idempotency-key" : o.idempotencyHeader;
    const given = header ? req.headers.get(header) : null;
    const credential = account ? `account:${account}` : `key:${apiKey}`;
    const idempotencyKey = given ? await keyedIdempotency(req, credential, given, o.maxKeyedBody ?? 1 << 20) : undefined;

    let admission: Admission;
    try {
      admission = await this.client.admit({
        ...(account ? { account } : { apiKey: apiKey as string }),
        ...(units !== undefined ? { units: checkUnits(units) } : {}),
        ...(tool !== undefined ? { tool } : {}),
        ...(o.maxWaitMs !== undefined ? { maxWaitMs: o.maxWaitMs } : {}),
        ...(idempotencyKey !== undefined ? { idempotencyKey } : {}),
      });
    } catch (e) {
      if (e instanceof MetergateError) {
        if (e.status >= 400 && e.status < 500 && !((e.status === 401 || e.status === 403) && serviceTokenCodes.has(e.code))) {
          const retryAfter = e instanceof RateLimitedError ? e.retryAfter : undefined;
          const body = Object.keys(e.body).length > 0 ? e.body : error(e.code, e.message);
          return json(e.status, body, replyHeaders(e.headers, retryAfter));
        }
        this.logger.error("metergate: admit refused this service or failed", e);
        return this.unavailable(o.failOpen === true && e.status >= 500);
      }
      this.logger.warn("metergate: admit unreachable", e);
      return this.unavailable(o.failOpen === true);
    }

    if (admission.replayed && idempotencyKey !== undefined) {
      // The caller's request was admitted, and served, before: serving it again would serve a
      // request nobody is billed for. (A replay of a random key is this call's own retry.)
      return json(409, error("idempotency_key_replayed", "a request with this idempotency key was admitted and served already"), {
        "idempotent-replayed": "true",
      });
    }
    const headers = replyHeaders(admission.headers);
    headers.delete("retry-after");
    const eventIdHeader = o.eventIdHeader === undefined ? "metergate-event-id" : o.eventIdHeader;
    if (eventIdHeader) headers.set(eventIdHeader, admission.eventId);
    return new Metering(admission, { headers, queue: this.outcomes, ...(idempotencyKey !== undefined ? { idempotencyKey } : {}) });
  }

  private unavailable(failOpen: boolean): Response | Metering {
    if (failOpen) {
      this.outcomes.stats.unbilled++;
      return new Metering();
    }
    return json(503, error("unavailable", "metering is unavailable; retry later"), { "retry-after": "1" });
  }
}
