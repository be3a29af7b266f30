/**
 * runTurn: one user turn, its events yielded exactly once and in seq order, through dropped
 * streams, sidecar restarts and retryable failures. The policy is policy.ts; this module
 * makes the calls and keeps the count.
 */

import type { CallOptions, Client } from "@connectrpc/connect";
import { create, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import type { RunEvent } from "./gen/roundtable/v1/events_pb.js";
import {
  type OrchestratorService,
  type StartRunRequest,
  StartRunRequestSchema,
} from "./gen/roundtable/v1/orchestrator_service_pb.js";
import { RoundtableError, toRoundtableError } from "./errors.js";
import {
  type Call,
  checkPolicy,
  decide,
  DEFAULT_RETRY_POLICY,
  gap,
  type RetryPolicy,
  SHUTDOWN_REASON,
  type Terminal,
} from "./policy.js";

/** What `runTurn` tells its `onRetry` hook before each call after the first. */
export interface RetryNotice {
  /** The RPC about to be sent: the same StartRun again, or StreamRun(after_seq). */
  readonly call: Call;
  /** StreamRun's after_seq: the seq of the last durable event yielded. */
  readonly afterSeq: bigint;
  /** How long runTurn waits before the call, in milliseconds. */
  readonly delayMs: number;
  /** Calls in a row without progress so far (see RetryPolicy.maxAttempts). */
  readonly failures: number;
  /** Why: the error, or the resumable terminal event. */
  readonly cause: string;
  /** The error that ended the last call, if one did. */
  readonly error: RoundtableError | undefined;
}

/** Options of one turn: the retry policy's knobs and the call's own. */
export interface TurnOptions extends Partial<RetryPolicy> {
  /** Stops the turn here (not in the sidecar: see cancelRun); runTurn then throws a CANCELED RoundtableError. */
  readonly signal?: AbortSignal;
  /** Headers (gRPC metadata) sent with every call of the turn. */
  readonly headers?: CallOptions["headers"];
  /** Yield assistant_delta events as they arrive (live only: not replayed, not deduplicated). Default true. */
  readonly deltas?: boolean;
  /** Called before every call after the first (for logs, metrics, span events). */
  readonly onRetry?: (notice: RetryNotice) => void;
}

/** A StartRunRequest, as a message or its init shape. */
export type StartRunInput = StartRunRequest | MessageInitShape<typeof StartRunRequestSchema>;

/**
 * Runs one turn and yields its events: every durable event exactly once, in seq order
 * (seq 1, 2, 3, ...), from run_started to the run's last terminal event, and the live
 * assistant_delta events as they come (unless `deltas` is false).
 *
 * A run stopped and resumed on the way (a sidecar restart, a retryable failure) holds each
 * execution in its log, so the iteration may show a run_cancelled (`server_shutdown`) or a
 * retryable run_failed followed by a run_started with `resumed` set; the turn's outcome is
 * the last event yielded. Errors come out as {@link RoundtableError}, after the retries the
 * options allow. Breaking out of the loop closes the stream; the run goes on in the sidecar
 * (DISCONNECT_POLICY_CONTINUE, the default) unless cancelled with cancelRun.
 */
export async function* runTurn(
  service: Client<typeof OrchestratorService>,
  input: StartRunInput,
  options: TurnOptions = {},
): AsyncGenerator<RunEvent, void, undefined> {
  const policy = checkPolicy({
    maxAttempts: options.maxAttempts ?? DEFAULT_RETRY_POLICY.maxAttempts,
    initialBackoffMs: options.initialBackoffMs ?? DEFAULT_RETRY_POLICY.initialBackoffMs,
    maxBackoffMs: options.maxBackoffMs ?? DEFAULT_RETRY_POLICY.maxBackoffMs,
    resendStartRun: options.resendStartRun ?? DEFAULT_RETRY_POLICY.resendStartRun,
  });
  // One request, sent byte for byte the same every time: the sidecar fingerprints it.
  const request = create(StartRunRequestSchema, input as MessageInitShape<typeof StartRunRequestSchema>);
  unsendable(request);
  const runId = request.context?.runId ?? "";
  const tenant = request.context?.tenant ?? "";
  const deltas = options.deltas ?? true;

  let lastSeq = 0n;
  let terminal: Terminal | undefined;
  let failures = 0;
  let unanswered = 0;
  let call: Call = "startRun";
  for (;;) {
    const controller = new AbortController();
    const abort = (): void => controller.abort(options.signal?.reason);
    options.signal?.addEventListener("abort", abort, { once: true });
    const callOptions: CallOptions = { signal: controller.signal, headers: options.headers };
    let progressed = false;
    let received = false; // the sidecar answered: a StartRun reached it
    let error: RoundtableError | undefined;
    try {
      throwIfAborted(options.signal);
      const stream =
        call === "startRun"
          ? service.startRun(request, callOptions)
          : service.streamRun({ runId, tenant, afterSeq: lastSeq }, callOptions);
      for await (const response of stream) {
        received = true;
        const event = response.event;
        if (event === undefined) {
          continue;
        }
        if (event.payload.case === "assistantDelta") {
          if (deltas) {
            yield event;
          }
          continue;
        }
        if (event.seq <= lastSeq) {
          continue; // handled already: a StartRun streams the run's log from seq 1
        }
        if (event.seq !== lastSeq + 1n) {
          throw gap(event.seq, lastSeq);
        }
        lastSeq = event.seq;
        terminal = terminalOf(event);
        progressed ||= terminal === undefined && !STARTS.has(event.payload.case);
        yield event;
      }
    } catch (caught) {
      throwIfAborted(options.signal);
      error = toRoundtableError(caught);
    } finally {
      options.signal?.removeEventListener("abort", abort);
      controller.abort(); // closes the stream, whatever ended it
    }
    failures = progressed ? 0 : failures + 1;
    unanswered = received ? 0 : unanswered + 1;
    const mustStart = call === "startRun" && !received;
    const decision = decide({ error, lastSeq, terminal, failures, unanswered, mustStart }, policy);
    if (decision.action === "done") {
      return;
    }
    if (decision.action === "fail") {
      throw decision.error;
    }
    call = decision.call;
    options.onRetry?.({
      call,
      afterSeq: lastSeq,
      delayMs: decision.delayMs,
      failures,
      cause: decision.cause,
      error,
    });
    await sleep(decision.delayMs, options.signal);
  }
}

/** Durable events that are no progress: every execution writes them again. */
const STARTS: ReadonlySet<RunEvent["payload"]["case"]> = new Set(["runStarted", "speakerStarted"]);

/** The terminal event's kind and whether the same StartRun would go on with the run. */

export function terminalOf(event: RunEvent): Terminal | undefined {
  switch (event.payload.case) {
    case "runCompleted":
      return { kind: "runCompleted", resumable: false, summary: "run_completed" };
    case "runCancelled": {
      const reason = event.payload.value.reason;
      return { kind: "runCancelled", resumable: reason === SHUTDOWN_REASON, summary: `run_cancelled ${reason}` };
    }
    case "runFailed": {
      const { code, retryable } = event.payload.value;
      return { kind: "runFailed", resumable: retryable, summary: `run_failed ${code}${retryable ? " (retryable)" : ""}` };
    }
    default:
      return undefined;
  }
}

function throwIfAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted) {
    throw new RoundtableError({
      code: Code.Canceled,
      message: "the turn was aborted by its signal",
      cause: signal.reason,
      retryable: false,
    });
  }
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  if (ms <= 0) {
    throwIfAborted(signal);
    return Promise.resolve();
  }
  return new Promise((resolve, reject) => {
    const done = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", aborted);
    };
    const aborted = (): void => {
      done();
      try {
        throwIfAborted(signal);
      } catch (e) {
        reject(e);
      }
    };
    const timer = setTimeout(() => {
      done();
      resolve();
    }, ms);
    if (signal?.aborted) {
      aborted();
      return;
    }
    signal?.addEventListener("abort", aborted, { once: true });
  });
}

/**
 * Throws, not retryable, when the request cannot be serialized (a plain object where a
 * message belongs, say): every attempt would fail the same way in this process, and the
 * transport calls that INTERNAL, which reads as a cut connection (outside testing: it was
 * retried to the last attempt, then thrown as retryable).
 */
function unsendable(request: StartRunRequest): void {
  try {
    toBinary(StartRunRequestSchema, request);
  } catch (cause) {
    throw new RoundtableError({
      code: Code.InvalidArgument,
      message: `the request cannot be serialized: ${cause instanceof Error ? cause.message : String(cause)}`,
      retryable: false,
      cause,
    });
  }
}
