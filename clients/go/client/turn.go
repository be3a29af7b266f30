package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"math/rand/v2"
	"time"

	roundtablev1 "github.com/roundtable/roundtable/clients/go/roundtable/v1"
	"google.golang.org/grpc/codes"
)

// Options tune RunTurn. A nil *Options means DefaultOptions(); in a non-nil one a zero
// MaxAttempts, InitialBackoff, MaxBackoff or TerminalGrace means its default.
type Options struct {
	// MaxAttempts bounds the calls (StartRun or StreamRun) in a row that bring no progress,
	// the first included: progress is a new durable event other than run_started,
	// speaker_started or a terminal one. Default 8.
	MaxAttempts int
	// InitialBackoff is the wait after a call the sidecar never answered (refused, cut
	// before any message); it doubles per such call in a row up to MaxBackoff, jittered into
	// its upper half. No wait after a call that got an answer; a RetryInfo's delay replaces
	// the backoff. Defaults 200 ms and 5 s.
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// ResendStartRun lets the library send the same StartRun again to resume a run whose
	// execution stopped before its end: run_cancelled "server_shutdown", a retryable
	// run_failed, DRAINING, RUN_ORPHANED. Off, such a run ends the turn: with its terminal
	// event, or with the error. Default on.
	ResendStartRun bool
	// TerminalGrace is how long a stream may stay open after a terminal event that is the
	// latest before the turn treats it as ended. Default 2 s.
	TerminalGrace time.Duration
	// OnRetry, if set, is told of every retry before its wait.
	OnRetry func(Retry)
	// OnSkip, if set, is told of every durable event delivered again and not yielded.
	OnSkip func(*roundtablev1.RunEvent)
}

// DefaultOptions is the policy of clients/conformance.md.
func DefaultOptions() Options {
	return Options{MaxAttempts: 8, InitialBackoff: 200 * time.Millisecond, MaxBackoff: 5 * time.Second,
		ResendStartRun: true, TerminalGrace: 2 * time.Second}
}

func (o *Options) withDefaults() Options {
	d := DefaultOptions()
	if o == nil {
		return d
	}
	out := *o
	if out.MaxAttempts <= 0 {
		out.MaxAttempts = d.MaxAttempts
	}
	if out.InitialBackoff <= 0 {
		out.InitialBackoff = d.InitialBackoff
	}
	if out.MaxBackoff <= 0 {
		out.MaxBackoff = d.MaxBackoff
	}
	if out.TerminalGrace <= 0 {
		out.TerminalGrace = d.TerminalGrace
	}
	return out
}

// Op names the call a retry sends.
type Op string

const (
	OpStartRun  Op = "StartRun"
	OpStreamRun Op = "StreamRun"
)

// Retry describes one retry, for logs and metrics.
type Retry struct {
	Op       Op     // the call about to be sent
	AfterSeq uint64 // StreamRun's after_seq (the last seq yielded)
	Attempt  int    // this call's number in the run of calls without progress (2 = first retry)
	Delay    time.Duration
	// Err is the failed call's error (an *Error); nil when its stream ended after Ended.
	Err error
	// Ended is set when the latest durable event is a resumable terminal one
	// (run_cancelled "server_shutdown", a retryable run_failed) that the StartRun resumes.
	Ended *roundtablev1.RunEvent
}

// endedEarly is a stream that ended OK without a terminal event.
func endedEarly() *Error {
	return &Error{Code: codes.Unavailable, Message: "the stream ended before a terminal event", Retryable: true}
}

// gap is a durable event whose seq is not the next one: re-attach from the last one handled.
func gap(seq, last uint64) *Error {
	return &Error{Code: codes.DataLoss, Message: fmt.Sprintf("event seq %d after %d: re-attaching from %d", seq, last, last), Retryable: true}
}

// RunTurn sends StartRun and yields the run's events: every durable event exactly once,
// in seq order, and the live deltas as they come, through dropped streams (re-attached with
// StreamRun(after_seq)), sidecar restarts and retryable failures (the same StartRun again),
// until the stream ends after the run's last terminal event (or, with ResendStartRun, a
// resumable one that MaxAttempts resends did not get past). An error ends the sequence: an
// *Error (errors.As) typed by the contract's reason, wrapped in ErrAttemptsExhausted when
// retries ran out, or the context's error.
//
//	for ev, err := range c.RunTurn(ctx, req, nil) {
//		if err != nil { return err }
//		if f := ev.GetAssistantFinal(); f != nil { save(f) }
//	}
func (c *Client) RunTurn(ctx context.Context, req *roundtablev1.StartRunRequest, opts *Options) iter.Seq2[*roundtablev1.RunEvent, error] {
	o := opts.withDefaults()
	return func(yield func(*roundtablev1.RunEvent, error) bool) {
		t := &turn{stub: c.stub, req: req, o: o, yield: yield}
		if err := t.run(ctx); err != nil && !t.stopped {
			yield(nil, err)
		}
	}
}

type turn struct {
	stub  roundtablev1.OrchestratorServiceClient
	req   *roundtablev1.StartRunRequest
	o     Options
	yield func(*roundtablev1.RunEvent, error) bool

	lastSeq uint64                 // the last durable event yielded
	ended   *roundtablev1.RunEvent // the last durable event yielded, when it is a terminal one
	stopped bool                   // the caller stopped iterating
}

// outcome is how one call ended.
type outcome struct {
	err        error // nil: the stream ended OK
	progressed bool  // it yielded a durable event other than run_started, speaker_started or a terminal one
	received   bool  // the sidecar answered: at least one message
}

func (t *turn) run(ctx context.Context) error {
	failures, unanswered := 0, 0
	op := OpStartRun
	for {
		out := t.call(ctx, op)
		if t.stopped {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if out.progressed {
			failures = 0
		} else {
			failures++
		}
		if out.received {
			unanswered = 0
		} else {
			unanswered++
		}
		mustStart := op == OpStartRun && !out.received
		var e *Error
		if out.err != nil {
			e = AsError(out.err)
			e.Attempts = failures
		}
		retry := Retry{AfterSeq: t.lastSeq, Attempt: failures + 1}
		if t.ended != nil {
			// The run's latest execution ended; an error after it is the stream closing, or
			// the resent StartRun not getting through.
			if !resumable(t.ended) || !t.o.ResendStartRun {
				return nil
			}
			if e != nil && !e.Retryable {
				return e // the resume was refused (RUN_CONTINUED, say)
			}
			if failures >= t.o.MaxAttempts {
				return nil // the turn ends with the resumable event: the same StartRun goes on later
			}
			retry.Op, retry.Ended, retry.Delay = OpStartRun, t.ended, t.backoff(max(unanswered, 1))
		} else {
			if e == nil {
				e = endedEarly()
				e.Attempts = failures
			}
			if !e.Retryable {
				return e
			}
			restart := e.Reason == ReasonDraining || e.Reason == ReasonRunOrphaned
			if restart && !t.o.ResendStartRun {
				return e
			}
			if failures >= t.o.MaxAttempts {
				return fmt.Errorf("%w after %d calls without progress: %w", ErrAttemptsExhausted, failures, e)
			}
			retry.Op, retry.Delay = OpStreamRun, t.backoff(unanswered)
			if restart || mustStart || t.lastSeq == 0 {
				retry.Op = OpStartRun
			}
		}
		if e != nil {
			retry.Err = e
			if e.HasRetryDelay {
				retry.Delay = e.RetryDelay
			}
		}
		op = retry.Op
		if t.o.OnRetry != nil {
			t.o.OnRetry(retry)
		}
		if retry.Delay > 0 {
			timer := time.NewTimer(retry.Delay)
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
				return ctx.Err()
			}
		}
	}
}

// backoff is the wait after n calls in a row the sidecar never answered: InitialBackoff
// doubled per call past the first, capped at MaxBackoff, jittered into its upper half (so
// gateways restarted together do not call together); none for n = 0.
func (t *turn) backoff(n int) time.Duration {
	if n <= 0 {
		return 0
	}
	full := t.o.InitialBackoff
	for i := 1; i < n && full < t.o.MaxBackoff; i++ {
		full *= 2
	}
	full = min(full, t.o.MaxBackoff)
	return full/2 + time.Duration(rand.Int64N(int64(full/2)+1))
}

// call sends one StartRun or StreamRun and yields its new events until the stream ends.
func (t *turn) call(ctx context.Context, op Op) (out outcome) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // closes the stream, whatever ends it
	var recv func() (*roundtablev1.RunEvent, error)
	if op == OpStartRun {
		stream, err := t.stub.StartRun(ctx, t.req)
		if err != nil {
			return outcome{err: err}
		}
		recv = func() (*roundtablev1.RunEvent, error) {
			r, err := stream.Recv()
			return r.GetEvent(), err
		}
	} else {
		stream, err := t.stub.StreamRun(ctx, &roundtablev1.StreamRunRequest{
			RunId: t.req.GetContext().GetRunId(), Tenant: t.req.GetContext().GetTenant(), AfterSeq: t.lastSeq,
		})
		if err != nil {
			return outcome{err: err}
		}
		recv = func() (*roundtablev1.RunEvent, error) {
			r, err := stream.Recv()
			return r.GetEvent(), err
		}
	}
	var grace *time.Timer // armed while this stream is caught up and the latest event is terminal
	defer func() {
		if grace != nil {
			grace.Stop()
		}
	}()
	for {
		ev, err := recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			out.err = err
			return out
		}
		out.received = true
		if ev.GetAssistantDelta() != nil { // live only, no seq of its own
			if !t.emit(ev) {
				return out
			}
			continue
		}
		seq := ev.GetSeq()
		switch {
		case seq <= t.lastSeq: // handled already: a StartRun streams the run's log from seq 1
			if t.o.OnSkip != nil {
				t.o.OnSkip(ev)
			}
		case seq != t.lastSeq+1:
			out.err = gap(seq, t.lastSeq)
			return out
		default:
			t.lastSeq, t.ended = seq, nil
			if terminal(ev) {
				t.ended = ev
			}
			out.progressed = out.progressed || (t.ended == nil && ev.GetRunStarted() == nil && ev.GetSpeakerStarted() == nil)
			if !t.emit(ev) {
				return out
			}
		}
		caughtUp := t.ended != nil && seq >= t.lastSeq
		switch {
		case caughtUp && grace == nil:
			// A terminal event ends the turn unless a later execution follows it (a run
			// stopped and resumed holds both in its log); the server ends the stream after
			// the last, so read to its end, bounded to be safe.
			grace = time.AfterFunc(t.o.TerminalGrace, cancel)
		case !caughtUp && grace != nil:
			grace.Stop()
			grace = nil
		}
	}
}
func (t *turn) emit(ev *roundtablev1.RunEvent) bool {
	if !t.yield(ev, nil) {
		t.stopped = true
		return false
	}
	return true
}

func terminal(ev *roundtablev1.RunEvent) bool {
	return ev.GetRunCompleted() != nil || ev.GetRunCancelled() != nil || ev.GetRunFailed() != nil
}

// ShutdownReason is run_cancelled's reason when the sidecar stopped the run to shut down:
// nobody cancelled it, and the same StartRun resumes it.
const ShutdownReason = "server_shutdown"

// resumable says whether the same StartRun would go on with a run that ended so.
func resumable(ev *roundtablev1.RunEvent) bool {
	if c := ev.GetRunCancelled(); c != nil {
		return c.GetReason() == ShutdownReason
	}
	return ev.GetRunFailed().GetRetryable()
}
