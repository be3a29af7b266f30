/** C6 INVALID_ARGUMENT: a snapshot with bad fields gives a typed error listing each field; no retry. */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Code, create, Reason, RoundtableClient, RoundtableError, SessionKind, SnapshotSchema, type RetryNotice } from "../src/index.js";
import { Sidecar, tempDir, turnRequest } from "./support.js";

const dir = tempDir("c6");
let sidecar: Sidecar;

before(async () => {
  sidecar = await Sidecar.start(dir.path);
});
after(async () => {
  await sidecar.stop();
  dir.remove();
});

test("C6 INVALID_ARGUMENT: every bad field listed in a typed error, nothing retried or stored", async () => {
  const client = new RoundtableClient({ address: sidecar.address });
  const bad = create(SnapshotSchema, {
    session: { sessionId: "bad", kind: SessionKind.GROUP, primaryMemberId: "nobody" },
    members: [
      { memberId: "lin", displayName: "Lin" },
      { memberId: "lin", displayName: "Lin again" },
      { memberId: "bo", displayName: "" },
    ],
    userTurn: { text: "hello", mentions: ["ghost"] },
  });
  const request = turnRequest("hello", "ts-tests", bad);
  const notices: RetryNotice[] = [];
  const started = Date.now();
  let caught: unknown;
  try {
    for await (const _ of client.runTurn(request, { onRetry: (n) => notices.push(n) })) {
      assert.fail("no event expected for a rejected request");
    }
  } catch (e) {
    caught = e;
  }
  assert.ok(caught instanceof RoundtableError, `not a RoundtableError: ${String(caught)}`);
  assert.equal(caught.code, Code.InvalidArgument);
  assert.equal(caught.reason, Reason.INVALID_REQUEST);
  assert.equal(caught.retryable, false);
  assert.deepEqual(notices, []);
  assert.ok(Date.now() - started < 5000);
  const fields = caught.fieldViolations.map((v) => v.field);
  for (const v of caught.fieldViolations) {
    assert.ok(v.description.length > 0, `no description for ${v.field}`);
  }
  // One violation per bad field: the duplicate id, the empty name, the primary member, the mention.
  const expected = [/members\[1\]\.member_id/, /members\[2\]\.display_name/, /primary_member_id/, /mentions/];
  for (const pattern of expected) {
    assert.ok(fields.some((f) => pattern.test(f)), `no violation matching ${pattern} in ${JSON.stringify(fields)}`);
  }
  // Nothing of a rejected request is stored.
  await assert.rejects(client.getRun({ runId: request.context!.runId, tenant: "ts-tests" }), (e: unknown) => {
    assert.ok(e instanceof RoundtableError);
    assert.equal(e.code, Code.NotFound);
    assert.equal(e.reason, Reason.RUN_NOT_FOUND);
    return true;
  });
});

test("C6 a request that cannot be serialized: a typed error at once, not retried", async () => {
  // Outside testing: the transport called it INTERNAL, which reads as a cut connection:
  // it was retried to the last attempt, about 10 s, then thrown as retryable.
  const client = new RoundtableClient({ address: sidecar.address });
  const request = turnRequest("hello", "ts-tests");
  // A plain object where a Member message belongs, as a JavaScript caller may push one.
  (request.snapshot!.members as unknown[]).push({ memberId: "kai", displayName: "Kai" });
  const notices: RetryNotice[] = [];
  const started = Date.now();
  let caught: unknown;
  try {
    for await (const _ of client.runTurn(request, { onRetry: (n) => notices.push(n) })) {
      assert.fail("no event expected for a request that cannot be sent");
    }
  } catch (e) {
    caught = e;
  }
  assert.ok(caught instanceof RoundtableError, `not a RoundtableError: ${String(caught)}`);
  assert.equal(caught.code, Code.InvalidArgument);
  assert.equal(caught.retryable, false);
  assert.match(caught.message, /cannot be serialized/);
  assert.deepEqual(notices, []);
  assert.ok(Date.now() - started < 2000);
});
