/**
 * C5 RESOURCE_EXHAUSTED with RetryInfo: `--max-runs 1` and a slow run holding the slot. The
 * library waits the RetryInfo's delay and sends StartRun again until the slot frees; with
 * maxAttempts spent it throws a RoundtableError with reason TOO_MANY_RUNS.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Code, Reason, RoundtableClient, RoundtableError, type RetryNotice, type RunEvent } from "../src/index.js";
import { assertExactlyOnceInOrder, durable, finalsOnce, groupSnapshot, Sidecar, tempDir, turnRequest } from "./support.js";

const dir = tempDir("c5");
let sidecar: Sidecar;
let client: RoundtableClient;

before(async () => {
  sidecar = await Sidecar.start(dir.path, ["--max-runs", "1"]);
  client = new RoundtableClient({ address: sidecar.address });
});
after(async () => {
  await sidecar.stop();
  dir.remove();
});

/** Starts a slow count-off (latencyMs a speaker) and resolves once it runs; `done` ends with it. */
async function holdTheSlot(latencyMs: number): Promise<{ done: Promise<RunEvent[]> }> {
  const events: RunEvent[] = [];
  let running!: () => void;
  const started = new Promise<void>((ok) => (running = ok));
  const done = (async () => {
    for await (const event of client.runTurn(turnRequest("大家报数！", "ts-tests", groupSnapshot("大家报数！", latencyMs)))) {
      events.push(event);
      if (event.payload.case === "runStarted") running();
    }
    return events;
  })();
  await Promise.race([started, done]);
  return { done };
}

test("C5 RESOURCE_EXHAUSTED: waits per RetryInfo, retries, completes once the slot frees", async () => {
  const slow = await holdTheSlot(400);
  const notices: RetryNotice[] = [];
  const events: RunEvent[] = [];
  for await (const event of client.runTurn(turnRequest("大家报数！"), { maxAttempts: 20, onRetry: (n) => notices.push(n) })) {
    events.push(event);
  }
  assertExactlyOnceInOrder(events);
  assert.equal(finalsOnce(events).size, 4);
  assert.ok(notices.length >= 1, "never refused: the slow run did not hold the slot");
  for (const n of notices) {
    assert.equal(n.call, "startRun");
    assert.equal(n.error?.reason, Reason.TOO_MANY_RUNS);
    assert.equal(n.error?.code, Code.ResourceExhausted);
    assert.equal(n.error?.retryDelayMs, 1000); // the server's RetryInfo, not the backoff
    assert.equal(n.delayMs, 1000);
  }
  const slowEvents = await slow.done;
  assert.equal(durable(slowEvents).at(-1)?.payload.case, "runCompleted");
});

test("C5 RESOURCE_EXHAUSTED: maxAttempts spent gives a typed TOO_MANY_RUNS error", async () => {
  const slow = await holdTheSlot(700);
  const started = Date.now();
  const notices: RetryNotice[] = [];
  const request = turnRequest("大家报数！");
  await assert.rejects(
    async () => {
      for await (const _ of client.runTurn(request, { maxAttempts: 2, onRetry: (n) => notices.push(n) })) {
        assert.fail("no event expected while the slot is held");
      }
    },
    (error: unknown) => {
      assert.ok(error instanceof RoundtableError);
      assert.equal(error.reason, Reason.TOO_MANY_RUNS);
      assert.equal(error.code, Code.ResourceExhausted);
      assert.equal(error.status, "RESOURCE_EXHAUSTED");
      assert.equal(error.retryable, true);
      assert.equal(error.retryDelayMs, 1000);
      return true;
    },
  );
  assert.equal(notices.length, 1); // two attempts: one wait between them
  assert.ok(Date.now() - started >= 950, "the library did not wait the RetryInfo delay");
  // Nothing was started: the run is unknown to the sidecar.
  await assert.rejects(client.getRun({ runId: request.context!.runId, tenant: "ts-tests" }), (e: unknown) => {
    assert.ok(e instanceof RoundtableError);
    assert.equal(e.reason, Reason.RUN_NOT_FOUND);
    return true;
  });
  await slow.done;
});
