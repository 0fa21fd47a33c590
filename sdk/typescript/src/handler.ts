// A wrapper for fetch-style route handlers (Next.js route handlers, Bun.serve, Deno.serve,
// Cloudflare Workers): a Request in, a Response out.

import { fromRequest, type Gate, type RouteOptions } from "./gate.js";

export interface HandlerOptions extends RouteOptions {
  gate: Gate;
}

/**
 * Admits every request before handler serves it (Gate.admit): a refusal is answered without
 * calling it; an admitted request's Metering is meteringOf(req) inside the handler, its reply
 * gets the RateLimit and event-id headers, and its outcome (status, units reported) is
 * queued when the reply's body has been sent: a streamed reply's tokens are known at its end.
 * A handler that throws is reported as 500 and the error rethrown. Other arguments (Next.js's
 * `{params}`) are passed on.
 *
 *     export const POST = withMetergate(async (req) => { … meteringOf(req)?.reportUnits({tokens}) … }, { gate });
 */
export function withMetergate<R extends Request, A extends unknown[]>(
  handler: (req: R, ...rest: A) => Response | Promise<Response>,
  opts: Gate | HandlerOptions,
): (req: R, ...rest: A) => Promise<Response> {
  const { gate, ...route } = "gate" in opts ? opts : { gate: opts };
  return async (req, ...rest) => {
    const m = await gate.admit(fromRequest(req), route, req);
    if (m instanceof Response) return m;
    let res: Response;
    try {
      res = await handler(req, ...rest);
    } catch (e) {
      m.end(500);
      throw e;
    }
    return m.finish(res, req.method);
  };
}
