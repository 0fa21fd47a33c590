// The outcome queue: reports outcomes (POST /v1/outcomes) off the reply's path.

import type { OutcomeOptions } from "./client.js";

/** Where the middleware logs what it cannot tell the caller (console by default). */
export interface Logger {
  warn(message: string, ...details: unknown[]): void;
  error(message: string, ...details: unknown[]): void;
}

export interface QueueOptions {
  /** Outcomes held at most, queued and not yet sent (10,000); past it they are dropped. */
  maxSize?: number;
  /** Outcomes sent at once (4). */
  workers?: number;
  logger?: Logger;
}

/** The queue's counters since it was made. */
export interface QueueStats {
  /** Outcomes admit accepted. */
  reported: number;
  /** Outcomes never sent: the queue was full. */
  dropped: number;
  /** Outcomes admit refused, or could not take after the client's retries. */
  failed: number;
  /** Requests served without an admission because admit could not decide (failOpen). */
  unbilled: number;
}

/**
 * Reports outcomes from a bounded queue drained by a few workers, so a reply never waits for
 * admit. push never blocks and never throws: a full queue drops the outcome and counts it
 * (the request stays billed at its admitted units, and its concurrency slot is released by
 * admit's lease expiry). Each report is retried by the client's policy with the same event
 * id (admit records one outcome per event id). flush() waits for what is queued: call it at
 * shutdown.
 */
export class OutcomeQueue {
  readonly stats: QueueStats = { reported: 0, dropped: 0, failed: 0, unbilled: 0 };
  private readonly send: (o: OutcomeOptions) => Promise<unknown>;
  private readonly maxSize: number;
  private readonly workers: number;
  private readonly logger: Logger;
  private items: OutcomeOptions[] = [];
  private head = 0;
  private active = 0;
  private inFlight = 0;
  private idle: (() => void)[] = [];

  constructor(client: { outcome(o: OutcomeOptions): Promise<unknown> }, opts: QueueOptions = {}) {
    this.maxSize = opts.maxSize ?? 10_000;
    this.workers = opts.workers ?? 4;
    if (!(this.maxSize >= 1 && this.workers >= 1)) throw new RangeError("OutcomeQueue needs maxSize >= 1 and workers >= 1");
    this.logger = opts.logger ?? console;
    this.send = (o) => client.outcome(o);
  }

  /** Outcomes queued or being sent. */
  get pending(): number {
    return this.items.length - this.head + this.inFlight;
  }

  /** Queues an outcome; false (and counted in stats.dropped) when the queue is full. */
  push(o: OutcomeOptions): boolean {
    if (this.items.length - this.head >= this.maxSize) {
      this.stats.dropped++;
      this.logger.warn("metergate: outcome queue full, outcome dropped", { eventId: o.eventId, status: o.status });
      return false;
    }
    this.items.push(o);
    if (this.active < this.workers) {
      this.active++;
      void this.work();
    }
    return true;
  }

  /** Resolves true once every queued outcome was sent (or failed), false after timeoutMs
   * with some still pending (they stay queued). */
  async flush(timeoutMs = 10_000): Promise<boolean> {
    if (this.pending === 0) return true;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const drained = new Promise<boolean>((resolve) => this.idle.push(() => resolve(true)));
    const late = new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(false), timeoutMs);
    });
    try {
      return await Promise.race([drained, late]);
    } finally {
      clearTimeout(timer);
    }
  }

  private take(): OutcomeOptions | undefined {
    if (this.head >= this.items.length) return undefined;
    const o = this.items[this.head++];
    if (this.head > 1024 && this.head * 2 > this.items.length) {
      this.items = this.items.slice(this.head);
      this.head = 0;
    }
    return o;
  }

  private async work(): Promise<void> {
    try {
      for (let o = this.take(); o !== undefined; o = this.take()) {
        this.inFlight++;
        try {
          await this.send(o);
          this.stats.reported++;
        } catch (e) {
          this.stats.failed++;
          this.logger.warn("metergate: report outcome", { eventId: o.eventId, status: o.status, error: e });
        } finally {
          this.inFlight--;
        }
      }
    } finally {
      this.active--;
      if (this.pending === 0) for (const wake of this.idle.splice(0)) wake();
    }
  }
}
