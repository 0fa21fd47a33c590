// withMetergate, the wrapper of fetch-style route handlers (Next.js): a Request in, a Response
// out. The behaviours behind it are in hono.test.ts.
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { meteringOf, withMetergate } from "../src/index.js";
import { eventId, fakeAdmit } from "./fake.js";

const request = (headers: Record<string, string> = { Authorization: "Bearer mgk_alice" }) =>
  new Request("http://app.test/api/chat", { method: "POST", headers, body: "{}" });

describe("withMetergate", () => {
  it("serves an admitted request, passes the Metering and the other arguments on, reports the outcome", async () => {
    const f = fakeAdmit();
    const route = withMetergate(
      async (req: Request, ctx: { params: Promise<{ id: string }> }) => {
        const m = meteringOf(req)!;
        m.reportUnits({ tokens: 9 });
        return Response.json({ id: (await ctx.params).id, event: m.eventId });
      },
      { gate: f.gate, units: () => ({ tokens: 100 }) },
    );
    const res = await route(request(), { params: Promise.resolve({ id: "c1" }) });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("Metergate-Event-Id"), eventId);
    assert.equal(res.headers.get("Content-Type"), "application/json");
    assert.deepEqual(await res.json(), { id: "c1", event: eventId });
    assert.equal(await f.gate.flush(2000), true);
    assert.deepEqual(f.outcomes(), [{ event_id: eventId, status: 200, units: { tokens: 9 } }]);
  });

  it("answers a refusal without calling the handler", async () => {
    const f = fakeAdmit({ admit: [{ status: 402, body: { decision: "insufficient_balance", account: "a", org: "o", blocked_by: {} } }] });
    let called = 0;
    const route = withMetergate(() => {
      called++;
      return new Response("no");
    }, f.gate);
    const res = await route(request());
    assert.equal(res.status, 402);
    assert.equal(((await res.json()) as { decision: string }).decision, "insufficient_balance");
    assert.equal(called, 0);
  });

  it("reports a streamed reply's tokens when its body has been sent", async () => {
    const f = fakeAdmit();
    async function* model() {
      yield { type: "response.output_text.delta", delta: "Hi" };
      yield { type: "response.completed", response: { usage: { input_tokens: 20, output_tokens: 4, total_tokens: 24 } } };
    }
    const route = withMetergate((req) => {
      const chunks = meteringOf(req)!.track(model());
      const enc = new TextEncoder();
      return new Response(
        new ReadableStream({
          async pull(ctl) {
            const { done, value } = await chunks.next();
            if (done) ctl.close();
            else ctl.enqueue(enc.encode(value.type + "\n"));
          },
        }),
      );
    }, f.gate);
    const res = await route(request());
    assert.equal(f.gate.outcomes.pending + f.outcomes().length, 0);
    assert.equal(await res.text(), "response.output_text.delta\nresponse.completed\n");
    assert.equal(await f.gate.flush(2000), true);
    assert.deepEqual(f.outcomes(), [{ event_id: eventId, status: 200, units: { tokens: 24 } }]);
  });

  it("reports a cancelled reply with the tokens seen so far", async () => {
    const f = fakeAdmit();
    const route = withMetergate((req) => {
      meteringOf(req)!.reportUnits({ tokens: 3 });
      return new Response(new ReadableStream({ pull() {} }));
    }, f.gate);
    const res = await route(request());
    await res.body!.cancel();
    assert.equal(await f.gate.flush(2000), true);
    assert.deepEqual(f.outcomes(), [{ event_id: eventId, status: 200, units: { tokens: 3 } }]);
  });

  it("reports a handler that throws as 500, and rethrows", async () => {
    const f = fakeAdmit();
    const route = withMetergate(() => {
      throw new Error("boom");
    }, f.gate);
    await assert.rejects(route(request()), /boom/);
    assert.equal(await f.gate.flush(2000), true);
    assert.deepEqual(f.outcomes(), [{ event_id: eventId, status: 500 }]);
  });

  it("refuses units metergate does not know, in the handler", async () => {
    const f = fakeAdmit();
    const route = withMetergate((req) => {
      const m = meteringOf(req)!;
      assert.throws(() => m.reportUnits({ input_tokens: 1 } as never), /unknown unit "input_tokens"/);
      assert.throws(() => m.reportUnits({ tokens: 1.5 }), /whole number/);
      assert.throws(() => m.reportUnits({ tokens: -1 }), RangeError);
      assert.deepEqual(m.units, {});
      return new Response(null, { status: 204 });
    }, f.gate);
    assert.equal((await route(request())).status, 204);
  });
});
