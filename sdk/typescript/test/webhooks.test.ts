// Webhook verification against a delivery signed by metergate's Go signer (internal/webhook):
// test/fixtures/webhook-go.json says how it was made.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { afterEach, beforeEach, describe, it, mock } from "node:test";

import { verifyWebhook, webhookTypes, WebhookVerificationError } from "../src/webhooks.js";

const fixture = JSON.parse(readFileSync(new URL("../../test/fixtures/webhook-go.json", import.meta.url), "utf8")) as {
  secrets: [string, string];
  headers: Record<string, string>;
  body: string;
};
const signedAt = Number(fixture.headers["webhook-timestamp"]) * 1000;

describe("verifyWebhook", () => {
  // The library checks the timestamp against Date.now(): the clock is set to the signing time.
  beforeEach(() => mock.timers.enable({ apis: ["Date"], now: signedAt + 60_000 }));
  afterEach(() => mock.timers.reset());

  it("accepts the Go signer's delivery with either secret of a rotation", () => {
    for (const secret of fixture.secrets) {
      const event = verifyWebhook(secret, fixture.body, fixture.headers);
      assert.equal(event.id, "alert/acme/requests/p80/2026-11");
      assert.equal(event.type, webhookTypes.usageThreshold);
      assert.equal(event.data["used"], 40000);
    }
  });

  it("reads fetch Headers, Node's header object and a body of bytes", () => {
    const headers = new Headers(fixture.headers);
    const bytes = new TextEncoder().encode(fixture.body);
    assert.equal(verifyWebhook(fixture.secrets[0], bytes, headers).id, "alert/acme/requests/p80/2026-11");
    const node = { "Webhook-Id": [fixture.headers["webhook-id"]!], "webhook-timestamp": fixture.headers["webhook-timestamp"], "webhook-signature": fixture.headers["webhook-signature"], host: "x" };
    assert.equal(verifyWebhook([fixture.secrets[1]], bytes, node).id, "alert/acme/requests/p80/2026-11");
  });

  it("refuses a tampered body", () => {
    const tampered = fixture.body.replace('"used":40000', '"used":4');
    assert.throws(() => verifyWebhook(fixture.secrets, tampered, fixture.headers), (e: unknown) => {
      assert.ok(e instanceof WebhookVerificationError);
      assert.match(e.message, /No matching signature/);
      return true;
    });
  });

  it("refuses another secret, another id, a missing signature", () => {
    const other = "whsec_" + Buffer.from("another secret, never used to sign").toString("base64");
    assert.throws(() => verifyWebhook(other, fixture.body, fixture.headers), WebhookVerificationError);
    assert.throws(() => verifyWebhook(fixture.secrets[0], fixture.body, { ...fixture.headers, "webhook-id": "alert/other" }), WebhookVerificationError);
    const { ["webhook-signature"]: _, ...unsigned } = fixture.headers;
    assert.throws(() => verifyWebhook(fixture.secrets[0], fixture.body, unsigned), /Missing required headers/);
    assert.throws(() => verifyWebhook(fixture.secrets[0], new Uint8Array([0xff, 0xfe]), fixture.headers), /not UTF-8/);
  });

  it("refuses a delivery more than 5 minutes old", () => {
    mock.timers.setTime(signedAt + 6 * 60_000);
    assert.throws(() => verifyWebhook(fixture.secrets[0], fixture.body, fixture.headers), /too old/);
  });
});
