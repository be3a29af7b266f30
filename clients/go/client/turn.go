package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"time"

	roundtablev1 "github.com/roundtable/roundtable/clients/go/roundtable/v1"
)

// Options tune RunTurn. A nil *Options means DefaultOptions(); in a non-nil one a zero
// MaxAttempts, InitialBackoff, MaxBackoff or TerminalGrace means its default.
type Options struct {
	// MaxAttempts bounds the calls in a row that yield no new durable event, the first
	// included (a call that yields one resets the count), and the resends after resumable
	// ends per turn. Default 5.
	MaxAttempts int
	// InitialBackoff is the wait before the first retry since the last progress; it
	// doubles per failure up to MaxBackoff. A RetryInfo's delay replaces it. Defaults
	// 200 ms and 5 s.
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// ResendStartRun lets the library send the same StartRun again: after a resumable
	// end (run_cancelled "server_shutdown", a retryable run_failed), after DRAINING,
	// RUN_ORPHANED or STREAM_GAP, and after a failure before the first event. Off, StartRun
	// is sent once per turn and those are surfaced. Default on.
	ResendStartRun bool
	// TerminalGrace is how long a stream may stay open after a terminal event before the
	// turn treats it as ended. Default 2 s.
	TerminalGrace time.Duration
	// OnRetry, if set, is told of every retry before its wait.
	OnRetry func(Retry)
	// OnSkip, if set, is told of every durable event delivered again and not yielded.
	OnSkip func(*roundtablev1.RunEvent)
}

// DefaultOptions is the policy of clients/conformance.md.
func DefaultOptions() Options {
	return Options{MaxAttempts: 5, InitialBackoff: 200 * time.Millisecond, MaxBackoff: 5 * time.Second,
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
	// Err is why: the failed call's error (an *Error, or a stream that ended or skipped a
	// seq), nil when Ended is set.
	Err error
	// Ended is the resumable terminal event (run_cancelled "server_shutdown", a retryable
	// run_failed) that the resent StartRun resumes.
	Ended *roundtablev1.RunEvent
}

var (
	errEndedEarly = errors.New("stream ended before a terminal event")
	errGap        = errors.New("gap in event seq")
)

// RunTurn sends StartRun and yields the run's events: every durable event exactly once,
// in seq order, and the live deltas as they come, through dropped streams (re-attached with
// StreamRun(after_seq)), sidecar restarts and retryable failures (the same StartRun again),
// until the stream ends after the run's last terminal event. An error ends the sequence:
// an *Error (errors.As) typed by the contract's reason, wrapped in ErrAttemptsExhausted
// when retries ran out, or the context's error.
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

	lastSeq   uint64                 // the last durable event yielded
	ended     *roundtablev1.RunEvent // the last terminal event, while no run_started followed it
	needStart bool                   // the next call is StartRun (a resend)
	starts    int                    // StartRun calls sent
	stopped   bool                   // the caller stopped iterating
}

func (t *turn) run(ctx context.Context) error {
	failures, resumes := 0, 0
	for {
		op := OpStreamRun
		if t.lastSeq == 0 || t.needStart {
			op = OpStartRun
		}
		before := t.lastSeq
		err := t.call(ctx, op)
		if t.stopped {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if t.lastSeq > before {
			failures = 0
		}
		retry := Retry{Op: OpStreamRun, AfterSeq: t.lastSeq}
		if err == nil { // the stream ended after a terminal event
			if !resumable(t.ended) || !t.o.ResendStartRun {
				return nil
			}
			if resumes++; resumes > t.o.MaxAttempts {
				return fmt.Errorf("%w: the run ended resumably (%s) %d times", ErrAttemptsExhausted, describe(t.ended), resumes-1)
			}
			failures++
			retry.Op, retry.Ended, retry.Delay = OpStartRun, t.ended, t.backoff(failures)
		} else {
			e := AsError(err)
			act := actionOf(e)
			if errors.Is(err, errEndedEarly) || errors.Is(err, errGap) {
				act = actNext
			}
			failures++
			e.Attempts = failures
			if act == actStop {
				return e
			}
			if act == actResend || t.lastSeq == 0 || t.needStart {
				retry.Op = OpStartRun
			}
			if retry.Op == OpStartRun && !t.o.ResendStartRun {
				return e
			}
			if failures >= t.o.MaxAttempts {
				return fmt.Errorf("%w after %d calls: %w", ErrAttemptsExhausted, failures, e)
			}
			retry.Err, retry.Delay = e, t.backoff(failures)
			if errors.Is(err, errEndedEarly) || errors.Is(err, errGap) {
				retry.Err = err
			}
			if e.HasRetryDelay {
				retry.Delay = e.RetryDelay
			}
		}
		retry.Attempt = failures + 1
		t.needStart = retry.Op == OpStartRun
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

func (t *turn) backoff(failures int) time.Duration {
	d := t.o.InitialBackoff
	for i := 1; i < failures && d < t.o.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, t.o.MaxBackoff)
}

// call sends one StartRun or StreamRun and yields its new events. It returns nil when the
// stream ended after a terminal event (the turn may be over), else why it stopped.
func (t *turn) call(ctx context.Context, op Op) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // closes the stream, whatever ends it
	var recv func() (*roundtablev1.RunEvent, error)
	if op == OpStartRun {
		t.starts++
		stream, err := t.stub.StartRun(ctx, t.req)
		if err != nil {
			return err
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
			return err
		}
		recv = func() (*roundtablev1.RunEvent, error) {
			r, err := stream.Recv()
			return r.GetEvent(), err
		}
	}
	atEnd := false // the last durable event this stream delivered is the run's latest, and terminal
	var grace *time.Timer
	defer func() {
		if grace != nil {
			grace.Stop()
		}
	}()
	for {
		ev, err := recv()
		if err != nil {
			if atEnd {
				return nil // ended (or cut, or timed out by the grace) after a terminal event
			}
			if errors.Is(err, io.EOF) {
				return errEndedEarly
			}
			return err
		}
		if op == OpStartRun {
			t.needStart = false
		}
		if ev.GetAssistantDelta() != nil { // live only, no seq of its own
			if !t.emit(ev) {
				return nil
			}
			continue
		}
		seq := ev.GetSeq()
		switch {
		case seq <= t.lastSeq:
			if t.o.OnSkip != nil {
				t.o.OnSkip(ev)
			}
			atEnd = seq == t.lastSeq && t.ended != nil
		case seq != t.lastSeq+1:
			return fmt.Errorf("%w: seq %d after %d", errGap, seq, t.lastSeq)
		default:
			t.lastSeq = seq
			switch {
			case ev.GetRunStarted() != nil:
				t.ended = nil
			case terminal(ev):
				t.ended = ev
			}
			atEnd = t.ended != nil
			if !t.emit(ev) {
				return nil
			}
		}
		switch {
		case atEnd && grace == nil:
			// A terminal event ends the turn unless a later execution follows it (a run
			// stopped and resumed holds both in its log); the server ends the stream after
			// the last, so read to its end, bounded to be safe.
			grace = time.AfterFunc(t.o.TerminalGrace, cancel)
		case !atEnd && grace != nil:
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

func describe(ev *roundtablev1.RunEvent) string {
	if c := ev.GetRunCancelled(); c != nil {
		return "run_cancelled " + c.GetReason()
	}
	if f := ev.GetRunFailed(); f != nil {
		return "run_failed " + f.GetCode()
	}
	return "run_completed"
}
