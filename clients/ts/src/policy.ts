/**
 * The retry policy of a turn, as a value, and the one function that decides what to do when
 * a stream ends. `runTurn` (turn.ts) acts on the decision; this module calls nothing.
 *
 * The policy every Roundtable client library shares:
 * - A stream that drops (a cut connection, a reset stream, a stream that ends before a
 *   terminal event, a gap in seq) is re-attached with StreamRun(after_seq = the last seq
 *   handled); before the first event arrived, the same StartRun is sent again instead (it is
 *   idempotent on run_id).
 * - The sidecar saying the run's execution stopped (UNAVAILABLE with DRAINING or
 *   RUN_ORPHANED; run_cancelled with reason `server_shutdown`; run_failed with `retryable`)
 *   sends the same StartRun again, which resumes the run, when `resendStartRun` is set.
 * - RESOURCE_EXHAUSTED waits for its RetryInfo delay, then sends the same call again
 *   (STREAM_OVERFLOW's delay is 0: re-attach at once).
 * - Anything else the server judged (INVALID_ARGUMENT, ALREADY_EXISTS, NOT_FOUND,
 *   FAILED_PRECONDITION, UNAUTHENTICATED, PERMISSION_DENIED, INTERNAL with an ErrorInfo, a
 *   RESOURCE_EXHAUSTED without one) is thrown at once: the same call would fail the same way.
 * - At most `maxAttempts` calls in a row may bring no progress (no new durable event other
 *   than run_started, speaker_started or a terminal one); then the last error is thrown, or, when the last
 *   call ended with a resumable terminal event, the iteration ends with that event.
 * - The wait before a call: after a call that brought progress, none (re-attach at once);
 *   after calls the sidecar never answered (refused, cut before any message), a backoff
 *   from `initialBackoffMs` doubling per such call up to `maxBackoffMs`, jittered into its
 *   upper half; before resending StartRun for a resumable terminal event, at least the
 *   first backoff; a RetryInfo's delay replaces the backoff.
 */

import { Code } from "@connectrpc/connect";
import { Reason, RoundtableError } from "./errors.js";

/** The knobs of the retry policy. */
export interface RetryPolicy {
  /**
   * The most calls (StartRun or StreamRun) in a row that bring no progress, the first call
   * included; 1 means no retry. Default 8 (with the default backoff, about 10 s of a sidecar that does not answer).
   */
  readonly maxAttempts: number;
  /** The first backoff, in milliseconds; it doubles with each call in a row without progress. Default 200. */
  readonly initialBackoffMs: number;
  /** The longest backoff, in milliseconds. Default 5000. */
  readonly maxBackoffMs: number;
  /**
   * Send the same StartRun again to resume a run whose execution stopped before its end
   * (DRAINING, RUN_ORPHANED, run_cancelled `server_shutdown`, a retryable run_failed).
   * Without it such a run ends the iteration: with its terminal event, or by throwing the
   * RoundtableError. Default true.
   */
  readonly resendStartRun: boolean;
}

/** The defaults of {@link RetryPolicy}. */
export const DEFAULT_RETRY_POLICY: Readonly<RetryPolicy> = Object.freeze({
  maxAttempts: 8,
  initialBackoffMs: 200,
  maxBackoffMs: 5000,
  resendStartRun: true,
});

/** The reason of a run_cancelled the sidecar wrote when it stopped the run to shut down. */
export const SHUTDOWN_REASON = "server_shutdown";

/** The last durable event handled, when it is a terminal one. */
export interface Terminal {
  readonly kind: "runCompleted" | "runCancelled" | "runFailed";
  /** The same StartRun would go on with the run (a shutdown, a retryable failure). */
  readonly resumable: boolean;
  /** For messages: `run_failed INTERNAL (retryable)`, `run_cancelled server_shutdown`... */
  readonly summary: string;
}

/** How one call of a turn ended. */
export interface Outcome {
  /** The call's error; undefined when its stream ended OK. */
  readonly error: RoundtableError | undefined;
  /** The seq of the last durable event handled (0: none yet). */
  readonly lastSeq: bigint;
  /** Set when the last durable event handled is a terminal one. */
  readonly terminal: Terminal | undefined;
  /** Calls in a row that brought no progress, this one included (0: this one did). */
  readonly failures: number;
  /** Calls in a row the sidecar never answered (no message), this one included. */
  readonly unanswered: number;
  /** A StartRun is owed: the run's execution stopped and nothing has resumed it yet. */
  readonly mustStart: boolean;
}

/** The RPC of the next call. */
export type Call = "startRun" | "streamRun";

/** What to do after a call ended. */
export type Decision =
  | { readonly action: "done" }
  | { readonly action: "fail"; readonly error: RoundtableError }
  | { readonly action: "retry"; readonly call: Call; readonly delayMs: number; readonly cause: string };

/** A stream that ended OK without a terminal event. */
export function endedEarly(): RoundtableError {
  return new RoundtableError({
    code: Code.Unavailable,
    message: "the stream ended before a terminal event",
    retryable: true,
  });
}

/** A durable event whose seq is not the next one: re-attach from the last one handled. */
export function gap(seq: bigint, lastSeq: bigint): RoundtableError {
  return new RoundtableError({
    code: Code.DataLoss,
    message: `event seq ${seq} after ${lastSeq}: re-attaching from ${lastSeq}`,
    retryable: true,
  });
}

/** Checks the knobs; throws a RangeError naming the first bad one. */
export function checkPolicy(policy: RetryPolicy): RetryPolicy {
  const whole = (name: string, value: number, min: number): void => {
    if (!Number.isInteger(value) || value < min) {
      throw new RangeError(`${name} must be an integer >= ${min}, got ${value}`);
    }
  };
  whole("maxAttempts", policy.maxAttempts, 1);
  whole("initialBackoffMs", policy.initialBackoffMs, 0);
  whole("maxBackoffMs", policy.maxBackoffMs, 0);
  return policy;
}

/**
 * The backoff before the next call after `failures` calls in a row without progress:
 * initialBackoffMs doubled per failure past the first, capped at maxBackoffMs, then
 * jittered into its upper half (so gateways restarted together do not call together).
 * No wait after a call that brought progress.
 */
export function backoffMs(policy: RetryPolicy, failures: number, random: () => number = Math.random): number {
  if (failures <= 0) {
    return 0;
  }
  const full = Math.min(policy.maxBackoffMs, policy.initialBackoffMs * 2 ** Math.min(failures - 1, 30));
  return Math.round(full / 2 + (random() * full) / 2);
}

/** Decides what follows a call: the turn is done, failed, or goes on with another call. */
export function decide(outcome: Outcome, policy: RetryPolicy, random: () => number = Math.random): Decision {
  const { terminal, failures, unanswered } = outcome;
  if (terminal !== undefined) {
    // The run's (latest) execution ended; an error after it is the stream closing, or the
    // resent StartRun not getting through.
    if (!terminal.resumable || !policy.resendStartRun) {
      return { action: "done" };
    }
    const error = outcome.error;
    if (error !== undefined && !error.retryable) {
      return { action: "fail", error }; // the resume was refused (RUN_CONTINUED, say)
    }
    if (failures >= policy.maxAttempts) {
      return { action: "done" };
    }
    const cause = error === undefined ? terminal.summary : `${terminal.summary}; ${error.toString()}`;
    const delayMs = error?.retryDelayMs ?? backoffMs(policy, Math.max(unanswered, 1), random);
    return { action: "retry", call: "startRun", delayMs, cause };
  }
  const error = outcome.error ?? endedEarly();
  if (!error.retryable) {
    return { action: "fail", error };
  }
  const restart = error.reason === Reason.DRAINING || error.reason === Reason.RUN_ORPHANED;
  if (restart && !policy.resendStartRun) {
    return { action: "fail", error };
  }
  if (failures >= policy.maxAttempts) {
    return { action: "fail", error };
  }
  const call: Call = restart || outcome.mustStart || outcome.lastSeq === 0n ? "startRun" : "streamRun";
  const delayMs = error.retryDelayMs ?? backoffMs(policy, unanswered, random);
  return { action: "retry", call, delayMs, cause: error.toString() };
}
