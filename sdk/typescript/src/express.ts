// Express (4 and 5) middleware, also for Connect and node:http handlers of the same shape:
// `app.use(express(gate))`. Typed by the shapes it uses, so it needs no express package.

import { type Gate, type IncomingRequest, type Metering, type RouteOptions } from "./gate.js";

declare global {
  // Express's res.locals (@types/express merges this interface into it).
  namespace Express {
    interface Locals {
      /** The request's Metering (set by @metergate/client/express's middleware). */
      metergate: Metering;
    }
  }
}

/** What the middleware reads of Express's req (a node:http IncomingMessage). */
export interface NodeRequest {
  method?: string | undefined;
  url?: string | undefined;
  originalUrl?: string | undefined;
  headers: Record<string, string | string[] | undefined>;
  /** Set by a body parser (express.json(), express.raw(), express.text()) that ran before. */
  body?: unknown;
}

/** What the middleware uses of Express's res (a node:http ServerResponse). */
export interface NodeResponse {
  statusCode: number;
  headersSent: boolean;
  locals?: Record<string, unknown>;
  setHeader(name: string, value: string): unknown;
  end(chunk: string): unknown;
  once(event: "finish" | "close", listener: () => void): unknown;
}

const encoder = new TextEncoder();

function hasBody(h: NodeRequest["headers"]): boolean {
  return h["transfer-encoding"] !== undefined || (h["content-length"] !== undefined && h["content-length"] !== "0");
}

/** Express's req as the middleware reads it. Its body is what a body parser that ran before
 * made of it; without one, a request with a body has its Idempotency-Key ignored (the stream
 * is left for the handler). */
export function fromNode(req: NodeRequest): IncomingRequest {
  const headers = new Headers();
  for (const [k, v] of Object.entries(req.headers)) {
    if (v === undefined) continue;
    for (const one of Array.isArray(v) ? v : [v]) headers.append(k, one);
  }
  const host = headers.get("host") ?? "localhost";
  return {
    method: req.method ?? "GET",
    url: `http://${host}${req.originalUrl ?? req.url ?? "/"}`,
    headers,
    readBody: async (max) => {
      const b = req.body;
      let bytes: Uint8Array | undefined;
      if (b instanceof Uint8Array) bytes = b;
      else if (typeof b === "string") bytes = encoder.encode(b);
      else if (b !== undefined && b !== null && (typeof b !== "object" || Object.keys(b).length > 0 || !hasBody(req.headers))) {
        bytes = encoder.encode(JSON.stringify(b)); // parsed JSON: the same request parses the same
      } else if (!hasBody(req.headers)) bytes = new Uint8Array();
      return bytes !== undefined && bytes.length <= max ? bytes : undefined;
    },
  };
}

/**
 * Admits every request before the next handlers run (Gate.admit): a refusal is answered
 * here; an admitted request's Metering is res.locals.metergate (also meteringOf(req)), its
 * reply gets the RateLimit and event-id headers, and its outcome (status, units reported) is
 * queued when the reply has been sent ("finish"), or as 499 when the caller hung up before
 * an answer.
 */
export function express(
  gate: Gate,
  route?: RouteOptions,
): (req: NodeRequest, res: NodeResponse, next: (err?: unknown) => void) => void {
  return (req, res, next) => {
    gate
      .admit(fromNode(req), route, req)
      .then(async (m) => {
        if (m instanceof Response) {
          res.statusCode = m.status;
          m.headers.forEach((v, k) => res.setHeader(k, v));
          res.end(await m.text());
          return;
        }
        if (res.locals) res.locals["metergate"] = m;
        else res.locals = { metergate: m };
        m.headers.forEach((v, k) => res.setHeader(k, v));
        res.once("finish", () => m.end(res.statusCode));
        res.once("close", () => m.end(res.headersSent ? res.statusCode : 499));
        next();
      })
      .catch(next);
  };
}

export { meteringOf, Gate, Metering } from "./gate.js";
