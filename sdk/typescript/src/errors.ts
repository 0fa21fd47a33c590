// Typed errors of metergate's APIs: each carries the reply's status, error code, message and
// JSON body. A refusal by admit (429, 402) has a decision body ({"decision": "rate_limited",
// "blocked_by": …}); every other error is {"error": {"code": …, "message": …}}.

/** A reply that is not a success. */
export class MetergateError extends Error {
  readonly status: number;
  readonly code: string;
  readonly body: Record<string, unknown>;
  /** The reply's headers (RateLimit, RateLimit-Policy, Retry-After, Idempotent-Replayed). */
  readonly headers: Headers;

  constructor(status: number, code: string, message: string, body: Record<string, unknown> = {}, headers: Headers = new Headers()) {
    super(`${status} ${code}: ${message}`);
    this.name = new.target.name;
    this.status = status;
    this.code = code;
    this.body = body;
    this.headers = headers;
  }
}

/** 429: a rate limit or concurrency cap is reached; nothing was charged. */
export class RateLimitedError extends MetergateError {
  /** Seconds to wait (the Retry-After header); undefined when the request can never pass. */
  readonly retryAfter: number | undefined;

  constructor(
    status: number,
    code: string,
    message: string,
    body: Record<string, unknown>,
    retryAfter: number | undefined,
    headers: Headers = new Headers(),
  ) {
    super(status, code, message, body, headers);
    this.retryAfter = retryAfter;
  }
}

/** 402: a quota is spent or a prepaid balance does not cover the request; nothing was charged. */
export class PaymentRequiredError extends MetergateError {}

/** 402 quota_exceeded: a quota of some level is spent for its period. */
export class QuotaExceededError extends PaymentRequiredError {}

/** 402 insufficient_balance: the credit grants of a unit the request carries do not cover it. */
export class InsufficientBalanceError extends PaymentRequiredError {}

/** 401: no credentials, or unknown ones (unknown_api_key). */
export class UnauthorizedError extends MetergateError {}

/** 403: credentials that do not open this route (a revoked key, a missing scope). */
export class ForbiddenError extends MetergateError {}

/** 503 after every retry: admit could not decide (Redis unavailable, policies loading). */
export class UnavailableError extends MetergateError {}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** The typed error of a reply with this status, JSON body, Retry-After (seconds) and headers. */
export function errorFor(status: number, body: unknown, retryAfter: number | undefined, headers: Headers = new Headers()): MetergateError {
  const b = isRecord(body) ? body : {};
  const err = isRecord(b["error"]) ? b["error"] : undefined;
  const code = String(err?.["code"] ?? b["decision"] ?? "error");
  const message = String(err?.["message"] ?? b["message"] ?? code);
  switch (status) {
    case 429:
      return new RateLimitedError(status, code, message, b, retryAfter, headers);
    case 402:
      if (code === "quota_exceeded") return new QuotaExceededError(status, code, message, b, headers);
      if (code === "insufficient_balance") return new InsufficientBalanceError(status, code, message, b, headers);
      return new PaymentRequiredError(status, code, message, b, headers);
    case 401:
      return new UnauthorizedError(status, code, message, b, headers);
    case 403:
      return new ForbiddenError(status, code, message, b, headers);
    case 503:
      return new UnavailableError(status, code, message, b, headers);
    default:
      return new MetergateError(status, code, message, b, headers);
  }
}
