/**
 * @roundtable/client: the TypeScript client of the Roundtable sidecar (roundtable.v1).
 *
 * `new RoundtableClient({ address })` then `client.runTurn(request, options)`: one turn's
 * events, each durable one exactly once and in seq order, through dropped streams, sidecar
 * restarts and retryable failures; `cancelRun`, `getRun` and `resolvePermission`; errors as
 * RoundtableError, typed by the contract's reasons. The generated messages are re-exported
 * as they are.
 */

export { CONTRACT_VERSION, ERROR_DOMAIN, Reason, RoundtableError, codeName, toRoundtableError } from "./errors.js";
export type { FieldViolation, RoundtableErrorInit } from "./errors.js";
export { DEFAULT_RETRY_POLICY, SHUTDOWN_REASON, backoffMs, checkPolicy, decide } from "./policy.js";
export type { Call, Decision, Outcome, RetryPolicy, Terminal } from "./policy.js";
export { runTurn, terminalOf } from "./turn.js";
export type { RetryNotice, StartRunInput, TurnOptions } from "./turn.js";
export { RoundtableClient, isLoopback, transportOf } from "./client.js";
export type { CancelOptions, ClientOptions, ResolvePermissionOptions, RunRef, TlsOptions } from "./client.js";
export * from "./gen/roundtable/v1/events_pb.js";
export * from "./gen/roundtable/v1/snapshot_pb.js";
export * from "./gen/roundtable/v1/orchestrator_service_pb.js";
export { Code } from "@connectrpc/connect";
export { create, toJson, fromJson, toJsonString } from "@bufbuild/protobuf";
export { timestampDate, timestampFromDate } from "@bufbuild/protobuf/wkt";
export type { Interceptor } from "@connectrpc/connect";
