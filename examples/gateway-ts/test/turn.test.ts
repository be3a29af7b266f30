/**
 * Turn's printing, against a fake client that yields a fixed log (no sidecar): a reply whose
 * text starts over (its model call retried after it had streamed) shows the new text on a
 * line of its own, not appended to the dropped chunks.
 */

import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { trace } from "@opentelemetry/api";
import {
  create,
  type RoundtableClient,
  type RunEvent,
  RunEventSchema,
  StartRunRequestSchema,
} from "@roundtable/client";
import { MemoryRules } from "../src/memory.js";
import { Store } from "../src/store.js";
import { Turn } from "../src/turn.js";

test("gateway-ts: deltas of a new attempt start a new line", async () => {
  const replyId = "r1#0";
  const delta = (attempt: number, text: string): RunEvent =>
    create(RunEventSchema, { payload: { case: "assistantDelta", value: { replyId, text, attempt } } });
  const log: RunEvent[] = [
    create(RunEventSchema, { seq: 1n, payload: { case: "runStarted", value: {} } }),
    create(RunEventSchema, { seq: 2n, payload: { case: "speakerStarted", value: { replyId, memberId: "mei", attempt: 1 } } }),
    delta(1, "Hel"),
    delta(2, "Hi "),
    delta(2, "there"),
    create(RunEventSchema, { seq: 3n, payload: { case: "assistantFinal", value: { replyId, memberId: "mei", content: "Hi there!" } } }),
    create(RunEventSchema, { seq: 4n, payload: { case: "runCompleted", value: {} } }),
  ];
  const client = { runTurn: async function* () { yield* log; } } as unknown as RoundtableClient;
  const request = create(StartRunRequestSchema, {
    context: { runId: "r1", threadId: "th", tenant: "demo" },
    snapshot: { members: [{ memberId: "mei", displayName: "Mei" }] },
  });
  const store = Store.open(join(mkdtempSync(join(tmpdir(), "rt-turn-")), "gw.json"));
  let printed = "";
  const turn = new Turn(client, request, store, new MemoryRules(store, "demo", "r1", new Map()),
    (text) => { printed += text; }, trace.getTracer("test").startSpan("turn"));
  await turn.run({ maxAttempts: 1, signal: new AbortController().signal });
  assert.ok(printed.includes("Mei: Hel\n   (again) Hi there!\n"), printed);
});
