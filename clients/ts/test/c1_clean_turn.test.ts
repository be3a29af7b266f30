/** C1 clean turn: a count-off with a 4-member roster, every durable event once, in order. */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { CancelOutcome, RoundtableClient, RunStatus, type RetryNotice, type RunEvent } from "../src/index.js";
import { assertExactlyOnceInOrder, durable, finalsOnce, groupSnapshot, shape, Sidecar, tempDir, turnRequest } from "./support.js";

const dir = tempDir("c1");
let sidecar: Sidecar;

before(async () => {
  sidecar = await Sidecar.start(dir.path, ["--offline-token-delay-ms", "5"]);
});
after(async () => {
  await sidecar.stop();
  dir.remove();
});

test("C1 clean turn: count-off yields run_started … run_completed, each seq once, 4 finals", async () => {
  const client = new RoundtableClient({ address: sidecar.address });
  const request = turnRequest("大家报数！");
  const events: RunEvent[] = [];
  const retries: string[] = [];
  for await (const event of client.runTurn(request, { onRetry: (n) => retries.push(n.cause) })) {
    events.push(event);
  }
  assert.deepEqual(retries, []);
  assert.equal(durable(events)[0]?.payload.case, "runStarted");
  assertExactlyOnceInOrder(events);
  const finals = finalsOnce(events);
  assert.equal(finals.size, 4);
  // Count-off: every member in roster order, each with its own number.
  const numbers = [...finals.values()].map((text) => /\d+/.exec(text)?.[0]);
  assert.deepEqual(numbers, ["1", "2", "3", "4"]);

  // The sidecar's log holds exactly what was yielded: GetRun's last seq and a fresh replay.
  const runId = request.context!.runId;
  const run = await client.getRun({ runId, tenant: "ts-tests" });
  assert.equal(run.status, RunStatus.SUCCEEDED);
  assert.equal(run.lastSeq, durable(events).at(-1)!.seq);
  assert.equal(run.finishedReplyIds.length, 4);
  const replay: RunEvent[] = [];
  for await (const r of client.service.streamRun({ runId, tenant: "ts-tests", afterSeq: 0n })) {
    if (r.event) replay.push(r.event);
  }
  assert.deepEqual(shape(events), shape(replay));
});

test("cancelRun mid-turn: the turn ends with run_cancelled, not resumed; getRun says CANCELLED", async () => {
  const client = new RoundtableClient({ address: sidecar.address });
  const request = turnRequest("大家报数！", "ts-tests", groupSnapshot("大家报数！", 200));
  const ref = { runId: request.context!.runId, tenant: "ts-tests" };
  const events: RunEvent[] = [];
  const notices: RetryNotice[] = [];
  for await (const event of client.runTurn(request, { onRetry: (n) => notices.push(n) })) {
    events.push(event);
    if (event.payload.case === "assistantFinal" && finalsOnce(events).size === 1) {
      const answer = await client.cancelRun({ ...ref, reason: "user pressed stop" });
      assert.equal(answer.outcome, CancelOutcome.REQUESTED);
    }
  }
  const last = durable(events).at(-1);
  assert.equal(last?.payload.case, "runCancelled");
  assert.equal(last.payload.case === "runCancelled" && last.payload.value.reason, "user pressed stop");
  assert.deepEqual(notices, []); // someone cancelled it: nothing to resume
  assert.ok(finalsOnce(events).size < 4);
  const run = await client.getRun(ref);
  assert.equal(run.status, RunStatus.CANCELLED);
  assert.equal(run.lastSeq, last.seq);
  const again = await client.cancelRun(ref);
  assert.equal(again.outcome, CancelOutcome.ALREADY_ENDED);
});
