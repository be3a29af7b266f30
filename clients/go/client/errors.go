package client

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of every error the sidecar sends on purpose.
const ErrorDomain = "roundtable.v1"

// The google.rpc.ErrorInfo reasons of the contract (orchestrator_service.proto's error table).
const (
	ReasonUndecodableRequest = "UNDECODABLE_REQUEST"
	ReasonInvalidRequest     = "INVALID_REQUEST"
	ReasonRunAlreadyExists   = "RUN_ALREADY_EXISTS"
	ReasonRunNotFound        = "RUN_NOT_FOUND"
	ReasonPermissionNotFound = "PERMISSION_NOT_FOUND" // ResolvePermission: no such request in the tenant's run
	ReasonThreadBusy         = "THREAD_BUSY"
	ReasonStreamGap          = "STREAM_GAP"
	ReasonRunContinued       = "RUN_CONTINUED"
	ReasonPermissionDecided  = "PERMISSION_DECIDED" // ResolvePermission: another decision (or expiry, cancel) is recorded
	ReasonTooManyRuns        = "TOO_MANY_RUNS"
	ReasonTooManyCalls       = "TOO_MANY_CALLS"
	ReasonTooManyStreams     = "TOO_MANY_STREAMS"
	ReasonStreamOverflow     = "STREAM_OVERFLOW"
	ReasonDraining           = "DRAINING"
	ReasonRunOrphaned        = "RUN_ORPHANED"
	ReasonUnauthenticated    = "UNAUTHENTICATED"
	ReasonTenantForbidden    = "TENANT_FORBIDDEN"
	ReasonInternal           = "INTERNAL"
)

// ErrAttemptsExhausted wraps the last error of a turn that gave up after Options.MaxAttempts
// calls in a row without progress (or as many resumes). errors.As still finds the *Error.
var ErrAttemptsExhausted = errors.New("roundtable: attempts exhausted")

// FieldViolation is one entry of an INVALID_ARGUMENT's google.rpc.BadRequest.
type FieldViolation struct {
	Field       string
	Description string
}

// Error is an error status from the sidecar (or the transport), typed by the contract.
// Tell errors apart by Reason (errors.Is(err, &client.Error{Reason: client.ReasonTooManyRuns})
// works too), not by Code alone: one code carries several reasons.
type Error struct {
	Code    codes.Code
	Reason  string // google.rpc.ErrorInfo.reason in domain roundtable.v1; "" when the status had none
	Message string
	// Retryable says whether the same call may succeed (clients/conformance.md): by Reason
	// when there is one, else by Code (a transport's failure).
	Retryable bool
	// RetryDelay is the google.rpc.RetryInfo delay, when HasRetryDelay.
	RetryDelay    time.Duration
	HasRetryDelay bool
	// Violations lists an INVALID_ARGUMENT's bad fields, each once.
	Violations []FieldViolation
	// Attempts is how many calls in a row ended without progress, this one included
	// (0 outside RunTurn).
	Attempts int

	status *status.Status
}

// Error says the code, the reason and the message.
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "roundtable: %s", e.Code)
	if e.Reason != "" {
		fmt.Fprintf(&b, " [%s]", e.Reason)
	}
	if e.Message != "" {
		fmt.Fprintf(&b, ": %s", e.Message)
	}
	for _, v := range e.Violations {
		fmt.Fprintf(&b, "; %s: %s", v.Field, v.Description)
	}
	return b.String()
}

// Is matches a target *Error by its Reason (and its Code, when the target sets one).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	if t.Reason != "" && t.Reason != e.Reason {
		return false
	}
	if t.Code != codes.OK && t.Code != e.Code {
		return false
	}
	return t.Reason != "" || t.Code != codes.OK
}

// GRPCStatus returns the status it came from, so status.Code and status.Convert still work.
func (e *Error) GRPCStatus() *status.Status {
	if e.status == nil {
		return status.New(e.Code, e.Message)
	}
	return e.status
}

// AsError types any error from a Roundtable call: a gRPC status (with its ErrorInfo,
// RetryInfo and BadRequest details) or, for anything else, an Error with code Unknown.
// It returns nil for nil.
func AsError(err error) *Error {
	if err == nil {
		return nil
	}
	var already *Error
	if errors.As(err, &already) {
		return already
	}
	st, _ := status.FromError(err)
	e := &Error{Code: st.Code(), Message: st.Message(), status: st}
	for _, detail := range st.Details() {
		switch d := detail.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == ErrorDomain {
				e.Reason = d.GetReason()
			}
		case *errdetails.RetryInfo:
			e.RetryDelay, e.HasRetryDelay = d.GetRetryDelay().AsDuration(), true
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				e.Violations = append(e.Violations, FieldViolation{Field: v.GetField(), Description: v.GetDescription()})
			}
		}
	}
	e.Retryable = retryableOf(e)
	return e
}

// retryableReasons are the reasons worth the same call again (after the RetryInfo delay, or
// a backoff); every other reason is the server's judgement of the request.
var retryableReasons = map[string]bool{
	ReasonTooManyRuns: true, ReasonTooManyCalls: true, ReasonTooManyStreams: true,
	ReasonStreamOverflow: true, ReasonDraining: true, ReasonRunOrphaned: true,
}

// retryableOf is the one rule of clients/conformance.md: with an ErrorInfo, its reason
// decides; without one, the codes a transport gives a cut, refused or reset connection
// (a RESOURCE_EXHAUSTED without ErrorInfo is the transport's size limit: not retryable).
func retryableOf(e *Error) bool {
	if e.Reason != "" {
		return retryableReasons[e.Reason]
	}
	switch e.Code {
	case codes.Unavailable, codes.Unknown, codes.Internal, codes.Aborted, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
}
