/** The retry policy's decisions, without a server: one per kind of ending. */

import assert from "node:assert/strict";
import { test } from "node:test";
import { Code } from "@connectrpc/connect";
import { backoffMs, checkPolicy, codeName, decide, DEFAULT_RETRY_POLICY, type Outcome, Reason, RoundtableError } from "../src/index.js";

const policy = DEFAULT_RETRY_POLICY;
const half = (): number => 0.5;

function outcome(o: Partial<Outcome>): Outcome {
  return { error: undefined, lastSeq: 5n, terminal: undefined, failures: 1, unanswered: 1, mustStart: false, ...o };
}

function err(code: Code, reason?: string, retryDelayMs?: number): RoundtableError {
  return new RoundtableError({ code, message: "m", reason, retryDelayMs });
}

test("policy: a dropped stream re-attaches with StreamRun, or resends StartRun before any event", () => {
  const cut = err(Code.Unavailable);
  assert.deepEqual(decide(outcome({ error: cut }), policy, half), { action: "retry", call: "streamRun", delayMs: 150, cause: cut.toString() });
  assert.equal((decide(outcome({ error: cut, lastSeq: 0n }), policy, half) as { call: string }).call, "startRun");
  assert.equal((decide(outcome({ error: cut, mustStart: true }), policy, half) as { call: string }).call, "startRun");
  // A stream that ended OK without a terminal event is a drop too; progress means no wait.
  assert.deepEqual(decide(outcome({ failures: 0, unanswered: 0 }), policy, half).action, "retry");
  assert.equal((decide(outcome({ failures: 0, unanswered: 0 }), policy, half) as { delayMs: number }).delayMs, 0);
});

test("policy: DRAINING and RUN_ORPHANED resend StartRun, unless resendStartRun is off", () => {
  for (const reason of [Reason.DRAINING, Reason.RUN_ORPHANED]) {
    const e = err(Code.Unavailable, reason);
    assert.equal((decide(outcome({ error: e }), policy, half) as { call: string }).call, "startRun");
    assert.deepEqual(decide(outcome({ error: e }), { ...policy, resendStartRun: false }), { action: "fail", error: e });
  }
});

test("policy: resumable terminal events resend StartRun; others end the turn", () => {
  const shutdown = { kind: "runCancelled", resumable: true, summary: "run_cancelled server_shutdown" } as const;
  const completed = { kind: "runCompleted", resumable: false, summary: "run_completed" } as const;
  assert.equal((decide(outcome({ terminal: shutdown, unanswered: 0 }), policy, half) as { call: string }).call, "startRun");
  assert.equal((decide(outcome({ terminal: shutdown, unanswered: 0 }), policy, half) as { delayMs: number }).delayMs, 150);
  assert.deepEqual(decide(outcome({ terminal: shutdown }), { ...policy, resendStartRun: false }), { action: "done" });
  assert.deepEqual(decide(outcome({ terminal: shutdown, failures: 8 }), policy), { action: "done" });
  assert.deepEqual(decide(outcome({ terminal: completed, error: err(Code.Unavailable) }), policy), { action: "done" });
  // A resend that gets through to a refusal stops there; a busy sidecar is waited for.
  const continued = err(Code.FailedPrecondition, Reason.RUN_CONTINUED);
  assert.deepEqual(decide(outcome({ terminal: shutdown, error: continued }), policy), { action: "fail", error: continued });
  const busy = err(Code.ResourceExhausted, Reason.TOO_MANY_RUNS, 1000);
  assert.equal((decide(outcome({ terminal: shutdown, error: busy }), policy, half) as { delayMs: number }).delayMs, 1000);
});

test("policy: RESOURCE_EXHAUSTED waits its RetryInfo; without one it is the size limit, thrown", () => {
  const busy = err(Code.ResourceExhausted, Reason.TOO_MANY_RUNS, 1000);
  assert.equal((decide(outcome({ error: busy, lastSeq: 0n }), policy, half) as { delayMs: number }).delayMs, 1000);
  const overflow = err(Code.ResourceExhausted, Reason.STREAM_OVERFLOW, 0);
  assert.deepEqual(decide(outcome({ error: overflow }), policy, half), { action: "retry", call: "streamRun", delayMs: 0, cause: overflow.toString() });
  const tooBig = err(Code.ResourceExhausted);
  assert.deepEqual(decide(outcome({ error: tooBig }), policy), { action: "fail", error: tooBig });
});

test("policy: errors the server judged are thrown at once; maxAttempts bounds the rest", () => {
  const never = [
    err(Code.InvalidArgument, Reason.INVALID_REQUEST),
    err(Code.AlreadyExists, Reason.RUN_ALREADY_EXISTS),
    err(Code.NotFound, Reason.RUN_NOT_FOUND),
    err(Code.NotFound, Reason.PERMISSION_NOT_FOUND),
    err(Code.FailedPrecondition, Reason.THREAD_BUSY),
    err(Code.FailedPrecondition, Reason.STREAM_GAP),
    err(Code.FailedPrecondition, Reason.PERMISSION_DECIDED),
    err(Code.Unauthenticated, Reason.UNAUTHENTICATED),
    err(Code.PermissionDenied, Reason.TENANT_FORBIDDEN),
    err(Code.Internal, Reason.INTERNAL),
    err(Code.Unauthenticated),
  ];
  for (const e of never) {
    assert.equal(e.retryable, false, e.toString());
    assert.deepEqual(decide(outcome({ error: e }), policy), { action: "fail", error: e });
  }
  const cut = err(Code.Unavailable);
  assert.deepEqual(decide(outcome({ error: cut, failures: 8 }), policy), { action: "fail", error: cut });
  assert.equal(decide(outcome({ error: cut, failures: 7 }), policy).action, "retry");
});

test("errors: gRPC's status names", () => {
  assert.equal(codeName(Code.ResourceExhausted), "RESOURCE_EXHAUSTED");
  assert.equal(codeName(Code.Canceled), "CANCELLED");
  assert.equal(codeName(Code.InvalidArgument), "INVALID_ARGUMENT");
  assert.equal(err(Code.Unavailable, Reason.DRAINING).toString(), "RoundtableError: UNAVAILABLE DRAINING: m");
});

test("policy: backoff doubles per unanswered call, capped, jittered into its upper half", () => {
  assert.equal(backoffMs(policy, 0), 0);
  assert.equal(backoffMs(policy, 1, () => 1), 200);
  assert.equal(backoffMs(policy, 1, () => 0), 100);
  assert.equal(backoffMs(policy, 3, () => 1), 800);
  assert.equal(backoffMs(policy, 20, () => 1), 5000);
  assert.throws(() => checkPolicy({ ...policy, maxAttempts: 0 }), /maxAttempts/);
  assert.throws(() => checkPolicy({ ...policy, initialBackoffMs: -1 }), /initialBackoffMs/);
});
