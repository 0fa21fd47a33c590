// Hono middleware: `app.use("/v1/*", hono(gate))`. Hono's types only: nothing of hono is
// loaded at run time, so this module runs wherever Hono does.

import type { MiddlewareHandler } from "hono";
import { fromRequest, type Gate, type Metering, type RouteOptions } from "./gate.js";

declare module "hono" {
  interface ContextVariableMap {
    /** The request's Metering (set by @metergate/client/hono's middleware). */
    metergate: Metering;
  }
}

/**
 * Admits every request before the handlers run (Gate.admit): a refusal is the reply; an
 * admitted request's Metering is c.get("metergate") (also meteringOf(c.req.raw)), its reply
 * gets the RateLimit and event-id headers, and its outcome (status, units reported) is
 * queued when the reply's body has been sent: a streamed reply's tokens are known at its end.
 */
export function hono(gate: Gate, route?: RouteOptions): MiddlewareHandler {
  return async (c, next) => {
    const m = await gate.admit(fromRequest(c.req.raw), route, c.req.raw);
    if (m instanceof Response) return m;
    c.set("metergate", m);
    await next(); // a handler's error is already c.res, Hono's 500
    c.res = m.finish(c.res, c.req.method);
    return undefined;
  };
}

export { meteringOf, Gate, Metering } from "./gate.js";
