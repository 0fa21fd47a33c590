// Verifying metergate's webhook deliveries (docs/webhooks.md): Standard Webhooks signatures,
// checked by the specification's own library (standardwebhooks), as internal/webhook signs
// them. `import { verifyWebhook } from "@metergate/client/webhooks"`.

import { Webhook, WebhookVerificationError } from "standardwebhooks";

export { WebhookVerificationError };

/** The CloudEvents types metergate delivers (the endpoint's event_types without `io.metergate.`). */
export const webhookTypes = {
  usageThreshold: "io.metergate.usage.threshold.v1",
  invoiceIssued: "io.metergate.invoice.issued.v1",
  invoiceStatusChanged: "io.metergate.invoice.status_changed.v1",
  creditNoteIssued: "io.metergate.credit_note.issued.v1",
} as const;

/** A delivery's body: the CloudEvent recorded. Fields and types metergate adds later pass
 * through as they came. */
export interface WebhookEvent {
  specversion: string;
  /** The webhook-id: the same on every retry and replay, so drop one already processed. */
  id: string;
  type: (typeof webhookTypes)[keyof typeof webhookTypes] | (string & {});
  source: string;
  subject?: string;
  time?: string;
  datacontenttype?: string;
  data: Record<string, unknown>;
  [field: string]: unknown;
}

/** A delivery's headers: fetch's Headers, or Node's (Express's req.headers). */
export type WebhookHeaders = Headers | Record<string, string | string[] | undefined>;

const names = ["webhook-id", "webhook-timestamp", "webhook-signature"] as const;

function pick(headers: WebhookHeaders): Record<string, string> {
  const out: Record<string, string> = {};
  if (headers instanceof Headers) {
    for (const n of names) {
      const v = headers.get(n);
      if (v !== null) out[n] = v;
    }
    return out;
  }
  for (const [k, v] of Object.entries(headers)) {
    const n = k.toLowerCase();
    const one = Array.isArray(v) ? v[0] : v;
    if ((names as readonly string[]).includes(n) && one !== undefined) out[n] = one;
  }
  return out;
}

/**
 * The event of a delivery whose signature one of the secrets (whsec_…) made, over the raw
 * body as received (read it before any JSON parser), with a timestamp within 5 minutes of
 * this clock. Give the old and the new secret while you switch (docs/webhooks.md, "Rotating
 * the secret"). Throws WebhookVerificationError otherwise: answer it 401, not 2xx.
 */
export function verifyWebhook(secret: string | readonly string[], body: string | Uint8Array, headers: WebhookHeaders): WebhookEvent {
  let payload: string;
  try {
    payload = typeof body === "string" ? body : new TextDecoder("utf-8", { fatal: true }).decode(body);
  } catch {
    throw new WebhookVerificationError("the body is not UTF-8");
  }
  const h = pick(headers);
  let last: unknown = new WebhookVerificationError("no secret to verify with");
  for (const s of typeof secret === "string" ? [secret] : secret) {
    try {
      const event = new Webhook(s).verify(payload, h);
      if (typeof event !== "object" || event === null) throw new WebhookVerificationError("the body is not a JSON object");
      return event as WebhookEvent;
    } catch (e) {
      last = e;
    }
  }
  throw last instanceof WebhookVerificationError ? last : new WebhookVerificationError(String(last instanceof Error ? last.message : last));
}
