package client

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

func wireError(t *testing.T, code codes.Code, reason string, delay *time.Duration, bad ...string) error {
	t.Helper()
	st := status.New(code, "msg")
	var details []protoadapt.MessageV1
	if reason != "" {
		details = append(details, &errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain})
	}
	if delay != nil {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(*delay)})
	}
	if len(bad) > 0 {
		br := &errdetails.BadRequest{}
		for i := 0; i+1 < len(bad); i += 2 {
			br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: bad[i], Description: bad[i+1]})
		}
		details = append(details, br)
	}
	for _, d := range details {
		var err error
		if st, err = st.WithDetails(d); err != nil {
			t.Fatal(err)
		}
	}
	return st.Err()
}

// The contract's error table (orchestrator_service.proto), row by row: what RunTurn does.
func TestPolicyOfEveryReason(t *testing.T) {
	second, zero := time.Second, time.Duration(0)
	for _, c := range []struct {
		code   codes.Code
		reason string
		delay  *time.Duration
		want   action
	}{
		{codes.InvalidArgument, ReasonInvalidRequest, nil, actStop},
		{codes.InvalidArgument, ReasonUndecodableRequest, nil, actStop},
		{codes.AlreadyExists, ReasonRunAlreadyExists, nil, actStop},
		{codes.NotFound, ReasonRunNotFound, nil, actStop},
		{codes.FailedPrecondition, ReasonThreadBusy, nil, actStop},
		{codes.FailedPrecondition, ReasonStreamGap, nil, actResend},
		{codes.FailedPrecondition, ReasonRunContinued, nil, actStop},
		{codes.ResourceExhausted, ReasonTooManyRuns, &second, actNext},
		{codes.ResourceExhausted, ReasonTooManyCalls, &second, actNext},
		{codes.ResourceExhausted, ReasonTooManyStreams, &second, actNext},
		{codes.ResourceExhausted, ReasonStreamOverflow, &zero, actNext},
		{codes.ResourceExhausted, "", nil, actStop}, // the transport's size limit
		{codes.Unauthenticated, ReasonUnauthenticated, nil, actStop},
		{codes.PermissionDenied, ReasonTenantForbidden, nil, actStop},
		{codes.Unavailable, ReasonDraining, nil, actResend},
		{codes.Unavailable, ReasonRunOrphaned, nil, actResend},
		{codes.Unavailable, "", nil, actNext}, // the transport
		{codes.Internal, ReasonInternal, nil, actNext},
		{codes.Unknown, "", nil, actNext},
	} {
		t.Run(fmt.Sprintf("%s_%s", c.code, c.reason), func(t *testing.T) {
			e := AsError(wireError(t, c.code, c.reason, c.delay))
			if e.Code != c.code || e.Reason != c.reason || e.HasRetryDelay != (c.delay != nil) {
				t.Fatalf("typed as %+v", e)
			}
			if c.delay != nil && e.RetryDelay != *c.delay {
				t.Fatalf("delay %s, want %s", e.RetryDelay, *c.delay)
			}
			if got := actionOf(e); got != c.want || e.Retryable != (c.want != actStop) {
				t.Fatalf("action %d (retryable %t), want %d", got, e.Retryable, c.want)
			}
		})
	}
}

func TestBadRequestViolationsAndMatching(t *testing.T) {
	err := wireError(t, codes.InvalidArgument, ReasonInvalidRequest, nil, "a.b", "is required", "c[0]", "too long")
	e := AsError(err)
	if len(e.Violations) != 2 || e.Violations[1] != (FieldViolation{"c[0]", "too long"}) {
		t.Fatalf("violations %+v", e.Violations)
	}
	wrapped := fmt.Errorf("%w after 2 calls: %w", ErrAttemptsExhausted, e)
	if !errors.Is(wrapped, &Error{Reason: ReasonInvalidRequest}) || errors.Is(wrapped, &Error{Reason: ReasonTooManyRuns}) {
		t.Fatal("errors.Is by reason")
	}
	if status.Code(wrapped) != codes.InvalidArgument {
		t.Fatalf("status.Code of the wrapped error: %s", status.Code(wrapped))
	}
	other := AsError(status.New(codes.Unavailable, "x").Err())
	if other.Reason != "" || !other.Retryable {
		t.Fatalf("%+v", other)
	}
	// An ErrorInfo of another domain is not ours.
	st, _ := status.New(codes.Unavailable, "x").WithDetails(&errdetails.ErrorInfo{Reason: ReasonDraining, Domain: "elsewhere"})
	if AsError(st.Err()).Reason != "" {
		t.Fatal("a foreign domain's reason was taken")
	}
}

func TestBackoffDoublesToTheMax(t *testing.T) {
	tr := &turn{o: (&Options{InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}).withDefaults()}
	var got []time.Duration
	for i := 1; i <= 6; i++ {
		got = append(got, tr.backoff(i))
	}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("backoff %v", got)
		}
	}
}
