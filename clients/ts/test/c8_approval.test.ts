/**
 * C8 approval: a tool call that needs approval. The turn's stream stays open while the run
 * waits; resolvePermission decides, and the same iteration goes on to the reply.
 */

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import {
  Code,
  PermissionDecision,
  type PermissionRequired,
  Reason,
  RoundtableClient,
  RoundtableError,
  ToolCallOutcome,
  type RunEvent,
} from "../src/index.js";
import { durable, Sidecar, tempDir, ToolServer, toolSnapshot, turnRequest } from "./support.js";

const dir = tempDir("c8");
let sidecar: Sidecar;
let tools: ToolServer;

before(async () => {
  tools = await ToolServer.start(dir.path);
  sidecar = await Sidecar.start(dir.path, ["--offline-token-delay-ms", "2"]);
});
after(async () => {
  await sidecar.stop();
  await tools.stop();
  dir.remove();
});

test("C8 approval: approve while the stream waits, decide again, deny", async () => {
  const client = new RoundtableClient({ address: sidecar.address });

  // (a) Approved: the tool runs once, the reply quotes it, its final lists the call.
  const request = turnRequest("@Mei use note to buy milk", "ts-tests", toolSnapshot("@Mei use note to buy milk", tools.url));
  const ref = { runId: request.context!.runId, tenant: "ts-tests" };
  const events: RunEvent[] = [];
  let asked: PermissionRequired | undefined;
  for await (const event of client.runTurn(request)) {
    events.push(event);
    if (event.payload.case === "permissionRequired") {
      asked = event.payload.value;
      const run = await client.getRun(ref);
      assert.deepEqual(run.pendingPermissions.map((p) => p.permissionRequestId), [asked.permissionRequestId]);
      const answer = await client.resolvePermission({
        ...ref,
        permissionRequestId: asked.permissionRequestId,
        decision: PermissionDecision.APPROVE,
      });
      assert.equal(answer.decision, PermissionDecision.APPROVE);
      assert.equal(answer.run?.runId, ref.runId);
      assert.ok(answer.decidedAt !== undefined);
    }
  }
  assert.ok(asked !== undefined, "no permission_required");
  const key = asked.permissionRequestId;
  assert.equal(asked.memberId, "mei");
  assert.equal(asked.toolName, "note");
  assert.equal(asked.arguments?.text, "buy milk");
  assert.ok(asked.argumentsJson !== "" && asked.expiresAt !== undefined);
  assert.equal(durable(events).at(-1)?.payload.case, "runCompleted");
  const finals = durable(events).flatMap((e) => (e.payload.case === "assistantFinal" ? [e.payload.value] : []));
  assert.equal(finals.length, 1);
  assert.match(finals[0]!.content, /noted 'buy milk'/);
  assert.deepEqual(
    finals[0]!.toolCalls.map((c) => [c.callId, c.toolName, c.outcome]),
    [[key, "note", ToolCallOutcome.OK]],
  );
  // The tool server sees the call's idempotency key: <tenant>/<run_id>/<request id>.
  assert.deepEqual(await tools.counts("note"), { [`${ref.tenant}/${ref.runId}/${key}`]: 1 });

  // (b) Decided: the same decision again answers the same; the other one, an unknown
  // request and an unknown run are typed errors, never retried.
  const again = await client.resolvePermission({ ...ref, permissionRequestId: key, decision: PermissionDecision.APPROVE });
  assert.equal(again.decision, PermissionDecision.APPROVE);
  for (const [runId, id, code, reason] of [
    [ref.runId, key, Code.FailedPrecondition, Reason.PERMISSION_DECIDED],
    [ref.runId, `${ref.runId}#0/9`, Code.NotFound, Reason.PERMISSION_NOT_FOUND],
    ["no-such-run", "x#0/1", Code.NotFound, Reason.RUN_NOT_FOUND],
  ] as const) {
    await assert.rejects(
      client.resolvePermission({ runId, tenant: "ts-tests", permissionRequestId: id, decision: PermissionDecision.DENY, reason: "too late" }),
      (e: unknown) => {
        assert.ok(e instanceof RoundtableError, String(e));
        assert.equal(e.code, code);
        assert.equal(e.reason, reason);
        assert.equal(e.retryable, false);
        if (reason === Reason.PERMISSION_DECIDED) {
          assert.match(e.message, /approve/);
        }
        return true;
      },
    );
  }

  // (c) Denied: the tool never runs, the member is told, the final says DENIED.
  const denyRequest = turnRequest("@Mei use note to sell the car", "ts-tests", toolSnapshot("@Mei use note to sell the car", tools.url));
  const denyRef = { runId: denyRequest.context!.runId, tenant: "ts-tests" };
  let denied = "";
  const denyEvents: RunEvent[] = [];
  for await (const event of client.runTurn(denyRequest)) {
    denyEvents.push(event);
    if (event.payload.case === "permissionRequired") {
      denied = event.payload.value.permissionRequestId;
      await client.resolvePermission({ ...denyRef, permissionRequestId: denied, decision: PermissionDecision.DENY, reason: "not today" });
    }
  }
  const denyFinals = durable(denyEvents).flatMap((e) => (e.payload.case === "assistantFinal" ? [e.payload.value] : []));
  assert.equal(denyFinals.length, 1);
  assert.deepEqual(denyFinals[0]!.toolCalls.map((c) => c.outcome), [ToolCallOutcome.DENIED]);
  assert.ok(denied !== "");
  assert.equal((await tools.counts("note"))[`${denyRef.tenant}/${denyRef.runId}/${denied}`], undefined);
});
