export {
  Client,
  backoffMs,
  defaultRetry,
  parseRetryAfter,
  randomKey,
  type AdmitAllowed,
  type AdmitOptions,
  type AdmitRequest,
  type Admission,
  type Api,
  type ApiMethod,
  type ClientOptions,
  type Fetch,
  type Method,
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
export {
  Gate,
  Metering,
  bearerOrApiKey,
  checkUnits,
  fromRequest,
  maxAmount,
  meteringOf,
  readBounded,
  unitNames,
  type GateOptions,
  type Incoming,
  type IncomingRequest,
  type Resolver,
  type RouteOptions,
} from "./gate.js";
export { withMetergate, type HandlerOptions } from "./handler.js";
export { openaiUsage, trackUsage, usageUnits, type Usage } from "./openai.js";
export { OutcomeQueue, type Logger, type QueueOptions, type QueueStats } from "./queue.js";
export type { components, paths } from "./schema.js";
