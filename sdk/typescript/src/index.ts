export {
  Client,
  backoffMs,
  defaultRetry,
  parseRetryAfter,
  type AdmitAllowed,
  type AdmitOptions,
  type AdmitRequest,
  type Admission,
  type ClientOptions,
  type OutcomeOptions,
  type OutcomeReply,
  type RetryPolicy,
  type Units,
} from "./client.js";
export {
  ForbiddenError,
  InsufficientBalanceError,
  MetergateError,
  PaymentRequiredError,
  QuotaExceededError,
  RateLimitedError,
  UnauthorizedError,
  UnavailableError,
  errorFor,
} from "./errors.js";
export type { components, paths } from "./schema.js";
