// A scripted admit for the middleware's tests: a fetch that answers POST /v1/admit and
// /v1/outcomes from queues of steps (then a default), and records every request.
import { Client, Gate, OutcomeQueue, type GateOptions, type Logger } from "../src/index.js";

/** A reply, an error thrown as fetch throws a refused connection, or "hang": never answered
 * until release(). */
export type Step = { status: number; body?: unknown; headers?: Record<string, string> } | Error | "hang";

export const eventId = "01a20804-77e5-7ea0-a840-0b728e6af015.15.acme";

export const allowed = (extra: Record<string, unknown> = {}): Step => ({
  status: 200,
  body: { decision: "allow", event_id: eventId, account: "agent-1", org: "acme", period: "2026-11", ...extra },
  headers: { RateLimit: '"acme-requests";r=299;t=1', "RateLimit-Policy": '"acme-requests";q=300;w=3' },
});

export const unavailable: Step = { status: 503, body: { error: { code: "unavailable", message: "Redis" } }, headers: { "Retry-After": "1" } };

export const accepted: Step = { status: 202, body: { status: "accepted", event_id: eventId } };

export interface Call {
  path: string;
  body: Record<string, unknown>;
}

/** A logger that keeps what it is told, so tests stay quiet and can read it. */
export function quietLogger(): Logger & { lines: string[] } {
  const lines: string[] = [];
  return { lines, warn: (m) => void lines.push(m), error: (m) => void lines.push(m) };
}

export function fakeAdmit(opts: { admit?: Step[]; outcomes?: Step[]; gate?: Partial<GateOptions>; queue?: { maxSize?: number; workers?: number } } = {}) {
  const admitSteps = [...(opts.admit ?? [])];
  const outcomeSteps = [...(opts.outcomes ?? [])];
  const calls: Call[] = [];
  const hung: (() => void)[] = [];
  const fetch = async (input: string | Request, init?: RequestInit): Promise<Response> => {
    const req = new Request(input, init);
    const path = new URL(req.url).pathname;
    const body = (await req.clone().json()) as Record<string, unknown>;
    calls.push({ path, body });
    const step = path === "/v1/admit" ? (admitSteps.shift() ?? allowed()) : (outcomeSteps.shift() ?? accepted);
    if (step === "hang") {
      await new Promise<void>((resolve) => hung.push(resolve));
      return respond(accepted as { status: number; body?: unknown });
    }
    if (step instanceof Error) throw step;
    return respond(step);
  };
  const sleeps: number[] = [];
  const client = new Client({
    baseUrl: "http://admit.test",
    token: "svc-token",
    fetch,
    sleep: async (ms) => void sleeps.push(ms),
    random: () => 0.5,
  });
  const logger = quietLogger();
  const outcomes = new OutcomeQueue(client, { logger, ...opts.queue });
  const gate = new Gate({ client, outcomes, logger, ...opts.gate });
  return {
    gate,
    client,
    calls,
    sleeps,
    logger,
    admits: () => calls.filter((c) => c.path === "/v1/admit").map((c) => c.body),
    outcomes: () => calls.filter((c) => c.path === "/v1/outcomes").map((c) => c.body),
    /** Answers every hung request (202). */
    release: () => hung.splice(0).forEach((r) => r()),
    hung: () => hung.length,
  };
}

function respond(step: { status: number; body?: unknown; headers?: Record<string, string> }): Response {
  return new Response(step.body === undefined ? null : JSON.stringify(step.body), {
    status: step.status,
    headers: { "Content-Type": "application/json", ...step.headers },
  });
}

/** Polls cond until it holds or the deadline passes (no fixed sleeps). */
export async function until(cond: () => boolean, what: string, ms = 2000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}
