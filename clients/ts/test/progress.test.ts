/**
 * What counts as progress, against a fake service (no sidecar): an execution that fails the
 * same way each time after beginning a speaker brings none, so the turn sends StartRun
 * maxAttempts times, not without end (each execution's speaker_started counted before).
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { Code, ConnectError } from "@connectrpc/connect";
import { create, type RunEvent, RunEventSchema, runTurn } from "../src/index.js";

test("progress: executions that fail after beginning a speaker are no progress", async () => {
  const log: RunEvent[] = [];
  let calls = 0;
  const add = (payload: RunEvent["payload"]): void => {
    log.push(create(RunEventSchema, { runId: "p1", seq: BigInt(log.length + 1), payload }));
  };
  const service = {
    async *startRun() {
      calls += 1;
      if (calls > 5) { // the bug: resent without end; end it so the test fails, not hangs
        throw new ConnectError("resent without end", Code.FailedPrecondition);
      }
      add({ case: "runStarted", value: { resumed: calls > 1 } } as RunEvent["payload"]);
      add({ case: "speakerStarted", value: { memberId: "a", attempt: 1 } } as RunEvent["payload"]);
      add({ case: "runFailed", value: { code: "INTERNAL", retryable: true } } as RunEvent["payload"]);
      for (const event of [...log]) {
        yield { event };
      }
    },
  };
  const seqs: bigint[] = [];
  let last: RunEvent | undefined;
  for await (const event of runTurn(service as never, { context: { runId: "p1", tenant: "t" } }, {
    maxAttempts: 3, initialBackoffMs: 1, maxBackoffMs: 1,
  })) {
    seqs.push(event.seq);
    last = event;
  }
  assert.equal(calls, 3);
  assert.equal(last?.payload.case, "runFailed");
  assert.deepEqual(seqs, Array.from({ length: 9 }, (_, i) => BigInt(i + 1)), "every durable event once, in order");
});
