/**
 * Errors typed by the contract's reasons (orchestrator_service.proto's error table).
 *
 * Every error the server sends on purpose carries a `google.rpc.ErrorInfo` in the domain
 * `roundtable.v1` with a stable reason; RESOURCE_EXHAUSTED carries a `google.rpc.RetryInfo`;
 * INVALID_ARGUMENT a `google.rpc.BadRequest`. They travel in the `grpc-status-details-bin`
 * trailer (a `google.rpc.Status`), which Connect decodes; this module reads them out.
 */

import { Code, ConnectError } from "@connectrpc/connect";
import {
  BadRequestSchema,
  ErrorInfoSchema,
  RetryInfoSchema,
} from "./gen/google/rpc/error_details_pb.js";

/** The contract version this library speaks: the proto package and the ErrorInfo domain. */
export const CONTRACT_VERSION = "roundtable.v1";

/** The `google.rpc.ErrorInfo.domain` of every error the server sends on purpose. */
export const ERROR_DOMAIN = CONTRACT_VERSION;

/**
 * The ErrorInfo reasons of the contract (orchestrator_service.proto), one per error kind.
 * A client tells errors of one status code apart by these.
 */
export const Reason = {
  /** INVALID_ARGUMENT: the request is malformed; `fieldViolations` lists every bad field. */
  INVALID_REQUEST: "INVALID_REQUEST",
  /** INVALID_ARGUMENT: the bytes do not parse as the request message. */
  UNDECODABLE_REQUEST: "UNDECODABLE_REQUEST",
  /** ALREADY_EXISTS: the run_id is known with a different snapshot. */
  RUN_ALREADY_EXISTS: "RUN_ALREADY_EXISTS",
  /** NOT_FOUND: no such run for this tenant. */
  RUN_NOT_FOUND: "RUN_NOT_FOUND",
  /** NOT_FOUND (ResolvePermission): no such permission request in this tenant's run. */
  PERMISSION_NOT_FOUND: "PERMISSION_NOT_FOUND",
  /** FAILED_PRECONDITION: the thread is busy and the policy is REJECT. */
  THREAD_BUSY: "THREAD_BUSY",
  /** FAILED_PRECONDITION: a StreamRun cannot be continued from after_seq. */
  STREAM_GAP: "STREAM_GAP",
  /** FAILED_PRECONDITION: a later run continued this one before its end. */
  RUN_CONTINUED: "RUN_CONTINUED",
  /**
   * FAILED_PRECONDITION (ResolvePermission): another decision, an expiry or a cancel is
   * recorded for the request; the message names it.
   */
  PERMISSION_DECIDED: "PERMISSION_DECIDED",
  /** RESOURCE_EXHAUSTED (RetryInfo): too many runs executing, in the process or the tenant. */
  TOO_MANY_RUNS: "TOO_MANY_RUNS",
  /** RESOURCE_EXHAUSTED (RetryInfo): too many calls in flight for this caller. */
  TOO_MANY_CALLS: "TOO_MANY_CALLS",
  /** RESOURCE_EXHAUSTED (RetryInfo): too many streams attached to this run. */
  TOO_MANY_STREAMS: "TOO_MANY_STREAMS",
  /** RESOURCE_EXHAUSTED (RetryInfo 0): the reader fell behind; re-attach at once. */
  STREAM_OVERFLOW: "STREAM_OVERFLOW",
  /** UNAUTHENTICATED: the caller's credentials are missing or wrong. */
  UNAUTHENTICATED: "UNAUTHENTICATED",
  /** PERMISSION_DENIED: the caller may not act for the request's tenant. */
  TENANT_FORBIDDEN: "TENANT_FORBIDDEN",
  /** UNAVAILABLE: the server is draining; send the same StartRun (elsewhere, or later). */
  DRAINING: "DRAINING",
  /** UNAVAILABLE: the run's execution stopped before its end; the same StartRun resumes it. */
  RUN_ORPHANED: "RUN_ORPHANED",
  /** INTERNAL: a bug in the server. */
  INTERNAL: "INTERNAL",
} as const;

/** One of the contract's reasons. */
export type Reason = (typeof Reason)[keyof typeof Reason];

/** Reasons worth the same call again (after `retryDelayMs`, or a backoff). */
const RETRYABLE_REASONS: ReadonlySet<string> = new Set<string>([
  Reason.TOO_MANY_RUNS,
  Reason.TOO_MANY_CALLS,
  Reason.TOO_MANY_STREAMS,
  Reason.STREAM_OVERFLOW,
  Reason.DRAINING,
  Reason.RUN_ORPHANED,
]);

/**
 * Status codes that, without an ErrorInfo, come from the transport rather than from the
 * server's judgement of the request (a cut connection, a refused one, a reset stream): the
 * same call may succeed. A RESOURCE_EXHAUSTED without ErrorInfo is the transport's size
 * limit and is not among them.
 */
const TRANSIENT_TRANSPORT_CODES: ReadonlySet<Code> = new Set([
  Code.Unavailable,
  Code.Unknown,
  Code.Internal,
  Code.Aborted,
  Code.DeadlineExceeded,
  Code.Canceled,
]);

/** One bad field of an INVALID_ARGUMENT (a `google.rpc.BadRequest.FieldViolation`). */
export interface FieldViolation {
  /** The field's path, e.g. `snapshot.members[1].member_id`; empty for the whole request. */
  readonly field: string;
  /** What is wrong with it. */
  readonly description: string;
}

/** What a RoundtableError is made of. */
export interface RoundtableErrorInit {
  readonly code: Code;
  readonly message: string;
  readonly reason?: string;
  readonly retryDelayMs?: number;
  readonly fieldViolations?: readonly FieldViolation[];
  readonly metadata?: Record<string, string>;
  readonly cause?: unknown;
  /** Overrides what the reason or code says (for errors this library makes itself). */
  readonly retryable?: boolean;
}

/**
 * An error of a Roundtable call, typed by the contract's reason.
 *
 * `reason` is the ErrorInfo reason (one of {@link Reason}) when the server sent one in the
 * `roundtable.v1` domain, and `""` for an error that did not come from the server's
 * judgement (a refused or cut connection, the transport's size limit). `retryable` says
 * whether the same call may succeed later; `runTurn` has already retried those as its
 * options allow by the time it throws one.
 */
export class RoundtableError extends Error {
  override readonly name = "RoundtableError";
  /** The gRPC status code (Connect's `Code`: the same numbers as gRPC). */
  readonly code: Code;
  /** The ErrorInfo reason, or `""` when the error carried none. */
  readonly reason: string;
  /** Whether the same call may succeed later. */
  readonly retryable: boolean;
  /** The RetryInfo delay, in milliseconds, when the server sent one. */
  readonly retryDelayMs: number | undefined;
  /** Every bad field of an INVALID_ARGUMENT, from its BadRequest (else empty). */
  readonly fieldViolations: readonly FieldViolation[];
  /** ErrorInfo metadata, when any. */
  readonly metadata: Readonly<Record<string, string>>;

  constructor(init: RoundtableErrorInit) {
    super(init.message, init.cause === undefined ? undefined : { cause: init.cause });
    this.code = init.code;
    this.reason = init.reason ?? "";
    this.retryDelayMs = init.retryDelayMs;
    this.fieldViolations = init.fieldViolations ?? [];
    this.metadata = init.metadata ?? {};
    this.retryable =
      init.retryable ??
      (this.reason !== "" ? RETRYABLE_REASONS.has(this.reason) : TRANSIENT_TRANSPORT_CODES.has(this.code));
  }

  /** The status code's canonical gRPC name, e.g. `RESOURCE_EXHAUSTED`. */
  get status(): string {
    return codeName(this.code);
  }

  override toString(): string {
    const reason = this.reason === "" ? "" : ` ${this.reason}`;
    return `RoundtableError: ${this.status}${reason}: ${this.message}`;
  }
}

/** `Code.ResourceExhausted` → `RESOURCE_EXHAUSTED`: gRPC's canonical names. */
export function codeName(code: Code): string {
  if (code === Code.Canceled) {
    return "CANCELLED"; // gRPC spells it with two Ls
  }
  const name = Code[code] as string | undefined;
  return name === undefined ? String(code) : name.replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
}

/**
 * Turns whatever a call threw into a RoundtableError, reading the google.rpc details of a
 * ConnectError. A RoundtableError is returned as it is.
 */
export function toRoundtableError(error: unknown): RoundtableError {
  if (error instanceof RoundtableError) {
    return error;
  }
  const connect = ConnectError.from(error);
  const info = connect.findDetails(ErrorInfoSchema).find((d) => d.domain === ERROR_DOMAIN);
  const retry = connect.findDetails(RetryInfoSchema)[0];
  const violations = connect
    .findDetails(BadRequestSchema)
    .flatMap((bad) => bad.fieldViolations.map((v) => ({ field: v.field, description: v.description })));
  let retryDelayMs: number | undefined;
  if (retry?.retryDelay !== undefined) {
    retryDelayMs = Number(retry.retryDelay.seconds) * 1000 + Math.floor(retry.retryDelay.nanos / 1e6);
  }
  return new RoundtableError({
    code: connect.code,
    message: connect.rawMessage,
    reason: info?.reason,
    retryDelayMs,
    fieldViolations: violations,
    metadata: info?.metadata,
    cause: error,
  });
}
