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

// The contract's error table (orchestrator_service.proto), row by row: typed, and retryable
// or not.
func TestPolicyOfEveryReason(t *testing.T) {
	second, zero := time.Second, time.Duration(0)
	for _, c := range []struct {
		code   codes.Code
		reason string
		delay  *time.Duration
		want   bool
	}{
		{codes.InvalidArgument, ReasonInvalidRequest, nil, false},
		{codes.InvalidArgument, ReasonUndecodableRequest, nil, false},
		{codes.AlreadyExists, ReasonRunAlreadyExists, nil, false},
		{codes.NotFound, ReasonRunNotFound, nil, false},
		{codes.NotFound, ReasonPermissionNotFound, nil, false},
		{codes.FailedPrecondition, ReasonThreadBusy, nil, false},
		{codes.FailedPrecondition, ReasonStreamGap, nil, false},
		{codes.FailedPrecondition, ReasonRunContinued, nil, false},
		{codes.FailedPrecondition, ReasonPermissionDecided, nil, false},
		{codes.ResourceExhausted, ReasonTooManyRuns, &second, true},
		{codes.ResourceExhausted, ReasonTooManyCalls, &second, true},
		{codes.ResourceExhausted, ReasonTooManyStreams, &second, true},
		{codes.ResourceExhausted, ReasonStreamOverflow, &zero, true},
		{codes.ResourceExhausted, "", nil, false}, // the transport's size limit
		{codes.Unauthenticated, ReasonUnauthenticated, nil, false},
		{codes.PermissionDenied, ReasonTenantForbidden, nil, false},
		{codes.Unavailable, ReasonDraining, nil, true},
		{codes.Unavailable, ReasonRunOrphaned, nil, true},
		{codes.Unavailable, "", nil, true},           // the transport
		{codes.Internal, ReasonInternal, nil, false}, // the server judged: a bug
		{codes.Internal, "", nil, true},              // a reset stream,
		{codes.Unknown, "", nil, true},
	} {
		t.Run(fmt.Sprintf("%s_%s", c.code, c.reason), func(t *testing.T) {
			e := AsError(wireError(t, c.code, c.reason, c.delay))
			if e.Code != c.code || e.Reason != c.reason || e.HasRetryDelay != (c.delay != nil) {
				t.Fatalf("typed as %+v", e)
			}
			if c.delay != nil && e.RetryDelay != *c.delay {
				t.Fatalf("delay %s, want %s", e.RetryDelay, *c.delay)
			}
			if e.Retryable != c.want {
				t.Fatalf("retryable %t, want %t", e.Retryable, c.want)
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

func TestBackoffDoublesToTheMaxJitteredIntoTheUpperHalf(t *testing.T) {
	tr := &turn{o: (&Options{InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}).withDefaults()}
	if tr.backoff(0) != 0 {
		t.Fatal("a wait after an answered call")
	}
	for n, full := range map[int]time.Duration{1: 100, 2: 200, 3: 400, 4: 800, 5: 1000, 9: 1000} {
		for range 50 {
			if d := tr.backoff(n); d < full*time.Millisecond/2 || d > full*time.Millisecond {
				t.Fatalf("backoff(%d) = %s, want within [%s, %s]", n, d, full*time.Millisecond/2, full*time.Millisecond)
			}
		}
	}
}
