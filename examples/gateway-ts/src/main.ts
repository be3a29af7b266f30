/**
 * gateway-ts: an example gateway for the Roundtable sidecar, on @roundtable/client. It owns
 * the data (a JSON file standing in for its database), sends Roundtable one user turn as an
 * immutable snapshot, prints the conversation as it streams, persists the replies once each,
 * validates the memory proposals by its own rules, and lets the library re-attach and resume
 * when the stream drops or the sidecar restarts. Its trace continues inside Roundtable.
 *
 *   node dist/src/main.js --text "大家报数！"
 */

import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { propagation, context, SpanStatusCode, trace } from "@opentelemetry/api";
import {
  create,
  DisconnectPolicy,
  type Member,
  RoundtableClient,
  RoundtableError,
  type Snapshot,
  SnapshotSchema,
  type StartRunRequest,
  StartRunRequestSchema,
  fromJson,
  toJson,
} from "@roundtable/client";
import { MemoryRules, type MemoryDecision } from "./memory.js";
import { buildSnapshot } from "./snapshot.js";
import { Store } from "./store.js";
import { setupTracing, TRACER_NAME, tracingInterceptor } from "./tracing.js";
import { type ReplyResult, type SpeakerFailure, Turn } from "./turn.js";

/** The machine-readable last line of the output (`SUMMARY {...}`), as gateway-go prints it. */
interface Summary {
  run_id: string;
  thread_id: string;
  tenant: string;
  request_id: string;
  /** completed, cancelled, failed or error. */
  status: string;
  replies: ReplyResult[];
  accepted_memories: Omit<MemoryDecision, "accepted">[];
  rejected_memories: Omit<MemoryDecision, "accepted">[];
  failed_speakers: SpeakerFailure[];
  missing_replies: string[];
  resumed: boolean;
  reattached: boolean;
  reattaches: number;
  restarts: number;
  last_seq: number;
  duplicate_finals: number;
  retried_run: boolean;
  trace_id: string;
  error?: string;
  error_reason?: string;
  field_violations?: { field: string; description: string }[];
}

const USAGE = `usage: gateway-ts [--text TEXT] [--target HOST:PORT] [--snapshot FILE] [--run-id ID]
  [--thread-id ID] [--tenant T] [--request-id ID] [--db FILE] [--timeout SECONDS]
  [--max-attempts N] [--token-file FILE] [--tls-ca FILE]`;

async function main(): Promise<number> {
  const { values: o } = parseArgs({
    options: {
      target: { type: "string", default: "127.0.0.1:50051" },
      snapshot: { type: "string", default: "" },
      text: { type: "string", default: "" },
      "run-id": { type: "string", default: "" },
      "thread-id": { type: "string", default: "demo-thread" },
      tenant: { type: "string", default: "demo" },
      "request-id": { type: "string", default: "" },
      db: { type: "string", default: "gateway-db.json" },
      timeout: { type: "string", default: "120" },
      "max-attempts": { type: "string", default: "8" },
      "token-file": { type: "string", default: "" },
      "tls-ca": { type: "string", default: "" },
      help: { type: "boolean", default: false },
    },
  });
  if (o.help) {
    console.log(USAGE);
    return 0;
  }
  const runId = o["run-id"] || `gw-${randomBytes(8).toString("hex")}`;
  const requestId = o["request-id"] || `req-${randomBytes(8).toString("hex")}`;
  const summary: Summary = {
    run_id: runId, thread_id: o["thread-id"], tenant: o.tenant, request_id: requestId, status: "error",
    replies: [], accepted_memories: [], rejected_memories: [], failed_speakers: [], missing_replies: [],
    resumed: false, reattached: false, reattaches: 0, restarts: 0, last_seq: 0, duplicate_finals: 0,
    retried_run: false, trace_id: "",
  };
  const tracing = setupTracing();
  if (tracing.exporting) {
    console.error("tracing: exporting spans with OTLP/gRPC");
  }
  try {
    return await turn(o, runId, requestId, summary);
  } catch (e) {
    return fail(summary, e);
  } finally {
    await tracing.shutdown().catch((e: unknown) => console.error(`tracing shutdown: ${String(e)}`));
    console.log(`SUMMARY ${JSON.stringify(summary)}`);
  }
}

type Options = {
  target: string; snapshot: string; text: string; "thread-id": string; tenant: string; db: string;
  timeout: string; "max-attempts": string; "token-file": string; "tls-ca": string;
};

async function turn(o: Options, runId: string, requestId: string, summary: Summary): Promise<number> {
  const store = Store.open(o.db);
  const { request, retried } = prepare(o, runId, requestId, store);
  summary.retried_run = retried;
  summary.thread_id = request.context!.threadId;

  const token = o["token-file"] !== "" ? readFileSync(o["token-file"], "utf8").trim() : process.env.ROUNDTABLE_TOKEN;
  const tracer = trace.getTracer(TRACER_NAME);
  const client = new RoundtableClient({
    address: o.target,
    tls: o["tls-ca"] === "" ? undefined : { ca: readFileSync(o["tls-ca"]) },
    token: token === "" ? undefined : token,
    interceptors: [tracingInterceptor(tracer)],
  });

  // Correlation fields travel as baggage; the turn is one span, the RPCs its children.
  const bag = propagation.createBaggage({
    tenant: { value: o.tenant }, request_id: { value: requestId }, thread_id: { value: summary.thread_id },
  });
  const parent = propagation.setBaggage(context.active(), bag);
  return tracer.startActiveSpan(
    "gateway.turn",
    {
      attributes: {
        // The correlation attributes Roundtable's own spans carry.
        "roundtable.run_id": runId,
        "roundtable.thread_id": summary.thread_id,
        "roundtable.request_id": requestId,
        "roundtable.tenant": o.tenant,
        "gen_ai.conversation.id": summary.thread_id,
      },
    },
    parent,
    async (span) => {
      summary.trace_id = span.spanContext().traceId;
      const members = new Map<string, Member>((request.snapshot?.members ?? []).map((m) => [m.memberId, m]));
      const rules = new MemoryRules(store, o.tenant, runId, members);
      const t = new Turn(client, request, store, rules, (s) => process.stdout.write(s), span);
      console.log(`you: ${request.snapshot?.userTurn?.text ?? ""}`);
      const signal = AbortSignal.any([AbortSignal.timeout(Number(o.timeout) * 1000), interrupted()]);
      try {
        const r = await t.run({ maxAttempts: Number(o["max-attempts"]), signal });
        Object.assign(summary, {
          status: r.terminal, replies: r.replies,
          accepted_memories: r.accepted.map(({ accepted: _, ...d }) => d),
          rejected_memories: r.rejected.map(({ accepted: _, ...d }) => d),
          failed_speakers: r.failed, missing_replies: r.missing, resumed: r.resumed, reattached: r.reattaches > 0,
          reattaches: r.reattaches, restarts: r.restarts, last_seq: r.lastSeq, duplicate_finals: r.duplicateFinals,
        });
        span.setAttributes({ "roundtable.replies": r.replies.length, "roundtable.reattaches": r.reattaches, "roundtable.last_seq": r.lastSeq });
        if (r.resumable) {
          // Stopped by the sidecar (shutdown) or failed retryably, and the resumes tried here
          // did not get through: the same run id goes on with it.
          const message = `${r.terminal} (${r.terminalMessage}): the run can go on; retry with --run-id ${runId}`;
          span.setStatus({ code: SpanStatusCode.ERROR, message });
          summary.error = message;
          console.error(`error: ${message}`);
          return 1;
        }
        if (r.terminal === "failed") {
          span.setStatus({ code: SpanStatusCode.ERROR, message: r.terminalMessage });
          summary.error = r.terminalMessage;
          return 1;
        }
        return r.terminal === "" ? 1 : 0;
      } catch (e) {
        span.recordException(e instanceof Error ? e : String(e));
        span.setStatus({ code: SpanStatusCode.ERROR, message: String(e) });
        summary.last_seq = t.result.lastSeq;
        summary.replies = t.result.replies;
        if (e instanceof RoundtableError && !e.retryable && t.result.lastSeq === 0) {
          store.updateRun(o.tenant, runId, "rejected", 0); // Roundtable refused the request itself
          store.save();
        }
        throw e;
      } finally {
        span.end();
      }
    },
  );
}

/**
 * The StartRunRequest. A run_id the store already knows is a retry of the same turn: it is
 * sent with the snapshot and thread stored for it (Roundtable attaches, resumes or replays).
 * A new one gets a fresh snapshot, stored before it is sent.
 */
function prepare(o: Options, runId: string, requestId: string, store: Store): { request: StartRunRequest; retried: boolean } {
  const stored = store.run(o.tenant, runId);
  let snapshot: Snapshot;
  let threadId = o["thread-id"];
  if (stored !== undefined) {
    snapshot = fromJson(SnapshotSchema, stored.snapshot as never);
    threadId = stored.thread_id;
    if (o.text !== "" && o.text !== snapshot.userTurn?.text) {
      console.error(`note: run ${runId} is retried with its stored snapshot; --text is ignored`);
    }
  } else {
    snapshot = buildSnapshot(o.snapshot, o.text, store, o.tenant, threadId);
    const turn = snapshot.userTurn;
    if ((turn?.text ?? "") === "" && (turn?.mentions.length ?? 0) === 0 && !(turn?.mentionAll ?? false)) {
      throw new Error("nothing to say: pass --text (or a snapshot with a user_turn)");
    }
    store.addRun(
      { tenant: o.tenant, run_id: runId, thread_id: threadId, snapshot: toJson(SnapshotSchema, snapshot), status: "started", last_seq: 0 },
      turn?.text ?? "",
    );
    store.save();
  }
  const request = create(StartRunRequestSchema, {
    context: { runId, threadId, requestId, tenant: o.tenant },
    snapshot,
    // Keep the run going when the stream drops; the library picks it up again with StreamRun.
    options: { disconnectPolicy: DisconnectPolicy.CONTINUE },
  });
  return { request, retried: stored !== undefined };
}

function fail(summary: Summary, error: unknown): number {
  summary.error = error instanceof Error ? error.message : String(error);
  console.error(`error: ${error instanceof RoundtableError ? error.toString() : summary.error}`);
  if (error instanceof RoundtableError) {
    summary.error_reason = error.reason;
    // INVALID_ARGUMENT lists every bad field.
    summary.field_violations = error.fieldViolations.map((v) => ({ ...v }));
    for (const v of error.fieldViolations) {
      console.error(`  ${v.field}: ${v.description}`);
    }
  }
  return 1;
}

/** Aborts on Ctrl-C or SIGTERM: the run goes on in the sidecar; the same --run-id picks it up. */
function interrupted(): AbortSignal {
  const controller = new AbortController();
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    process.once(signal, () => controller.abort(new Error(`${signal}: the run goes on in the sidecar`)));
  }
  return controller.signal;
}

process.exitCode = await main();
