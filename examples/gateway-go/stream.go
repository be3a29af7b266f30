package main

// stream.go: one user turn. StartRun streams the run's events; when the stream drops
// before a terminal event, StreamRun(after_seq = the last seq handled) re-attaches and
// nothing is lost: every event but a delta is durable in Roundtable's log, and its seq
// never changes, so events already handled are recognised by seq and skipped.
//
// What the gateway persists is idempotent on its own keys as well: a final reply once
// per (run_id, reply_id), whatever replays, re-attaches or resumes deliver it again.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	roundtablev1 "github.com/roundtable/roundtable/clients/go/roundtable/v1"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// shutdownReason is run_cancelled's reason when the sidecar stopped the run to shut
// down: nobody cancelled it, and the same StartRun resumes it.
const shutdownReason = "server_shutdown"

var (
	// errDropHook is the -drop-after test hook closing the stream on purpose.
	errDropHook = errors.New("stream closed by -drop-after")
	// errEndedEarly is a stream that ended cleanly without a terminal event.
	errEndedEarly = errors.New("stream ended before a terminal event")
	// errGap is a durable event whose seq is not the next one: re-attach from the last
	// one handled rather than skip anything.
	errGap = errors.New("gap in event seq")
)

// ReplyResult is one reply of the run as this process saw it.
type ReplyResult struct {
	ReplyID   string `json:"reply_id"`
	MemberID  string `json:"member_id"`
	Step      uint32 `json:"step"`
	Content   string `json:"content"`
	Persisted bool   `json:"persisted"` // stored by this process (false: it was stored before)
}

// SpeakerFailure is a speaker_failed event.
type SpeakerFailure struct {
	ReplyID  string `json:"reply_id"`
	MemberID string `json:"member_id"`
	Code     string `json:"code"`
}

// Turn runs one user turn to its terminal event.
type Turn struct {
	Client      roundtablev1.OrchestratorServiceClient
	Request     *roundtablev1.StartRunRequest
	Store       *Store
	Memory      *MemoryRules
	Out         io.Writer
	DropAfter   int // test hook: close the first stream after this many durable events
	MaxFailures int // consecutive failed attempts (without progress) before giving up

	names       map[string]string // member_id -> display name
	speakers    map[string]string // reply_id -> member_id, from the plan
	lastSeq     uint64            // the last durable event handled
	handled     int               // durable events handled
	dropped     bool
	reattaches  int // StreamRun re-attaches
	resumed     bool
	terminal    string // completed, cancelled or failed, once a terminal event arrived
	terminalMsg string
	resumable   bool // the terminal event says the same StartRun would go on with the run
	restart     bool // send StartRun again (to resume), not StreamRun
	replies     map[string]*ReplyResult
	accepted    []MemoryDecision
	rejected    []MemoryDecision
	failed      []SpeakerFailure
	skipped     int // durable events delivered again and ignored (by seq)
	dupFinals   int // finals of replies that were already persisted
	missing     []string
	open        string // the reply whose line is being printed
	openText    string // the delta text printed on that line
}

// Run streams the turn, re-attaching as often as needed, until a terminal event.
func (t *Turn) Run(ctx context.Context) error {
	t.names, t.speakers, t.replies = map[string]string{}, map[string]string{}, map[string]*ReplyResult{}
	for _, m := range t.Request.GetSnapshot().GetMembers() {
		t.names[m.GetMemberId()] = m.GetDisplayName()
	}
	span := trace.SpanFromContext(ctx)
	backoff, failures := 200*time.Millisecond, 0
	for {
		before := t.handled
		err := t.attach(ctx)
		if t.terminal != "" && !t.resumable {
			return nil
		}
		if t.terminal != "" {
			// Stopped by the sidecar's shutdown, or failed retryably: the same StartRun
			// resumes the run (finished speakers are kept), here or on a restarted sidecar.
			if failures++; failures > t.MaxFailures {
				return nil // the summary says it can be resumed with -run-id
			}
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return ctx.Err()
			}
			backoff = min(2*backoff, 5*time.Second)
			fmt.Fprintf(t.Out, "── the run can go on (%s); sending the same StartRun to resume it\n", t.terminalMsg)
			span.AddEvent("resume", trace.WithAttributes(attribute.String("cause", t.terminalMsg)))
			t.restart = true
			continue
		}
		if ctx.Err() != nil {
			return fmt.Errorf("turn aborted after seq %d: %w", t.lastSeq, ctx.Err())
		}
		if !reattachable(err) {
			return err
		}
		if t.handled > before {
			backoff, failures = 200*time.Millisecond, 0
		}
		if !errors.Is(err, errDropHook) {
			if failures++; failures > t.MaxFailures {
				return fmt.Errorf("giving up after %d retries: %w", t.MaxFailures, err)
			}
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return ctx.Err()
			}
			backoff = min(2*backoff, 5*time.Second)
		}
		t.endLine()
		if t.lastSeq == 0 || t.restart { // StartRun is idempotent on run_id
			span.AddEvent("retry_start_run", trace.WithAttributes(attribute.String("cause", err.Error())))
			fmt.Fprintf(t.Out, "── StartRun failed (%v); sending it again\n", err)
			continue
		}
		t.reattaches++
		span.AddEvent("reattach", trace.WithAttributes(
			attribute.Int64("after_seq", int64(t.lastSeq)), attribute.String("cause", err.Error())))
		fmt.Fprintf(t.Out, "── stream lost (%v); re-attaching with StreamRun(after_seq=%d)\n", err, t.lastSeq)
	}
}

// attach opens one stream (StartRun first, StreamRun once something was handled) and
// handles its events until the terminal event or an error.
func (t *Turn) attach(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // closes the stream, whatever ends it
	var recv func() (*roundtablev1.RunEvent, error)
	if t.lastSeq == 0 || t.restart {
		stream, err := t.Client.StartRun(ctx, t.Request)
		if err != nil {
			return err
		}
		// It streams the run's log from seq 1: what was handled is skipped by seq.
		t.restart = false
		recv = func() (*roundtablev1.RunEvent, error) {
			r, err := stream.Recv()
			return r.GetEvent(), err
		}
	} else {
		stream, err := t.Client.StreamRun(ctx, &roundtablev1.StreamRunRequest{
			RunId:    t.Request.GetContext().GetRunId(),
			Tenant:   t.Request.GetContext().GetTenant(),
			AfterSeq: t.lastSeq,
		})
		if err != nil {
			return err
		}
		recv = func() (*roundtablev1.RunEvent, error) {
			r, err := stream.Recv()
			return r.GetEvent(), err
		}
	}
	var stop *time.Timer // armed while the last event handled is a terminal one
	defer func() {
		if stop != nil {
			stop.Stop()
		}
	}()
	for {
		ev, err := recv()
		if t.terminal != "" && err != nil {
			// The stream ended after the run's last terminal event (or the wait for more
			// was cut short): the turn is over.
			return nil
		}
		if errors.Is(err, io.EOF) {
			return errEndedEarly
		}
		if err != nil {
			return err
		}
		if err := t.handle(ev); err != nil {
			return err
		}
		switch {
		case t.terminal != "" && stop == nil:
			// A terminal event ends the turn unless a later execution follows it (a run
			// stopped and resumed holds both in its log); the server ends the stream after
			// the last, so read to its end, bounded to be safe.
			stop = time.AfterFunc(2*time.Second, cancel)
		case t.terminal == "" && stop != nil:
			stop.Stop() // a resumed execution's run_started: the run goes on
			stop = nil
		}
		if t.DropAfter > 0 && !t.dropped && t.handled >= t.DropAfter {
			t.dropped = true
			return errDropHook
		}
	}
}

// reattachable says whether a stream error is worth a re-attach. Errors about the
// request itself (INVALID_ARGUMENT, ALREADY_EXISTS, NOT_FOUND, FAILED_PRECONDITION...)
// are not: the same request would fail the same way.
func reattachable(err error) bool {
	if errors.Is(err, errDropHook) || errors.Is(err, errEndedEarly) || errors.Is(err, errGap) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded, codes.Aborted,
		codes.ResourceExhausted, codes.Internal, codes.Unknown:
		return true
	}
	return false
}

// handle handles one event: deltas are printed, durable events are handled once each,
// in seq order.
func (t *Turn) handle(ev *roundtablev1.RunEvent) error {
	if d := ev.GetAssistantDelta(); d != nil { // live only, never replayed: just show it
		t.printDelta(d)
		return nil
	}
	seq := ev.GetSeq()
	if seq <= t.lastSeq {
		t.skipped++
		return nil
	}
	if seq != t.lastSeq+1 {
		return fmt.Errorf("%w: seq %d after %d", errGap, seq, t.lastSeq)
	}
	if err := t.apply(ev); err != nil {
		return err
	}
	t.lastSeq = seq
	t.handled++
	return nil
}

// apply does what the gateway does with one durable event.
func (t *Turn) apply(ev *roundtablev1.RunEvent) error {
	ctx := t.Request.GetContext()
	switch p := ev.GetPayload().(type) {
	case *roundtablev1.RunEvent_RunStarted:
		t.resumed = t.resumed || p.RunStarted.GetResumed()
		t.terminal, t.terminalMsg, t.resumable = "", "", false // an earlier execution's end was not the run's
		note := ""
		if p.RunStarted.GetResumed() {
			note = " (resumed)"
		}
		t.endLine()
		fmt.Fprintf(t.Out, "── run started%s: %s\n", note, enumName(p.RunStarted.GetRoute().String(), "ROUTE_"))
	case *roundtablev1.RunEvent_PlanCreated:
		plan := p.PlanCreated
		var who []string
		for _, s := range plan.GetSteps() {
			t.speakers[s.GetReplyId()] = s.GetMemberId()
			who = append(who, t.name(s.GetMemberId()))
		}
		if len(who) == 0 {
			who = []string{"nobody"}
		}
		why := ""
		if plan.GetFallbackReason() != "" {
			why = " (" + plan.GetFallbackReason() + ")"
		}
		t.endLine()
		fmt.Fprintf(t.Out, "── plan [%s, %s%s] round %d: %s\n",
			enumName(plan.GetDirective().String(), "DIRECTIVE_KIND_"),
			enumName(plan.GetSource().String(), "PLAN_SOURCE_"), why, plan.GetRound(), strings.Join(who, ", "))
	case *roundtablev1.RunEvent_SpeakerStarted:
		s := p.SpeakerStarted
		t.speakers[s.GetReplyId()] = s.GetMemberId()
		t.startLine(s.GetReplyId(), s.GetAttempt())
	case *roundtablev1.RunEvent_AssistantFinal:
		return t.persistReply(p.AssistantFinal)
	case *roundtablev1.RunEvent_SpeakerFailed:
		f := p.SpeakerFailed
		t.failed = append(t.failed, SpeakerFailure{f.GetReplyId(), f.GetMemberId(), f.GetCode()})
		t.endLine()
		fmt.Fprintf(t.Out, "   ✗ %s failed: %s (%s, %d attempt(s))\n", t.name(f.GetMemberId()), f.GetCode(), f.GetMessage(), f.GetAttempts())
	case *roundtablev1.RunEvent_MemoryProposed:
		t.endLine()
		for _, proposal := range p.MemoryProposed.GetProposals() {
			d := t.Memory.Decide(proposal)
			if d.Accepted {
				t.accepted = append(t.accepted, d)
				fmt.Fprintf(t.Out, "── memory for %s: accepted %s %q (importance %.2f) as %s\n",
					t.name(d.MemberID), d.Action, d.Content, d.Importance, d.MemoryID)
			} else {
				t.rejected = append(t.rejected, d)
				fmt.Fprintf(t.Out, "── memory for %s: rejected %s %q: %s\n", t.name(d.MemberID), d.Action, d.Content, d.Reason)
			}
		}
		t.Store.UpdateRun(ctx.GetTenant(), ctx.GetRunId(), "", ev.GetSeq())
		return t.Store.Save()
	case *roundtablev1.RunEvent_PermissionRequired:
		t.endLine()
		fmt.Fprintf(t.Out, "── permission requested by %s for %s (tool approval is not supported by this gateway)\n",
			t.name(p.PermissionRequired.GetMemberId()), p.PermissionRequired.GetAction())
	case *roundtablev1.RunEvent_RunCompleted:
		done := p.RunCompleted
		for _, r := range done.GetReplies() {
			if t.Store.Reply(ctx.GetTenant(), ctx.GetRunId(), r.GetReplyId()) == nil {
				t.missing = append(t.missing, r.GetReplyId())
			}
		}
		t.endLine()
		fmt.Fprintf(t.Out, "── done: %d reply(ies), %d+%d tokens\n", len(done.GetReplies()),
			done.GetUsage().GetInputTokens(), done.GetUsage().GetOutputTokens())
		if len(t.missing) > 0 {
			fmt.Fprintf(t.Out, "── warning: replies never delivered to this gateway: %s\n", strings.Join(t.missing, ", "))
		}
		return t.finish("completed", "", ev.GetSeq())
	case *roundtablev1.RunEvent_RunCancelled:
		c := p.RunCancelled
		t.endLine()
		fmt.Fprintf(t.Out, "── cancelled (%s); %d step(s) left\n", c.GetReason(), len(c.GetStepsLeft()))
		t.resumable = c.GetReason() == shutdownReason
		return t.finish("cancelled", c.GetReason(), ev.GetSeq())
	case *roundtablev1.RunEvent_RunFailed:
		f := p.RunFailed
		t.endLine()
		fmt.Fprintf(t.Out, "── failed: %s %s (retryable: %t)\n", f.GetCode(), f.GetMessage(), f.GetRetryable())
		t.resumable = f.GetRetryable()
		return t.finish("failed", f.GetCode()+": "+f.GetMessage(), ev.GetSeq())
	default:
		t.endLine()
		fmt.Fprintf(t.Out, "── (an event this gateway does not know, seq %d)\n", ev.GetSeq())
	}
	return nil
}

// persistReply stores a final reply once per (run_id, reply_id).
func (t *Turn) persistReply(f *roundtablev1.AssistantFinal) error {
	ctx := t.Request.GetContext()
	stored := t.Store.PutReply(Message{
		Tenant: ctx.GetTenant(), ThreadID: ctx.GetThreadId(), RunID: ctx.GetRunId(),
		ReplyID: f.GetReplyId(), MemberID: f.GetMemberId(), Step: f.GetStep(), Content: f.GetContent(),
		Model: f.GetModel(), FinishReason: enumName(f.GetFinishReason().String(), "FINISH_REASON_"),
	})
	if stored {
		t.Store.UpdateRun(ctx.GetTenant(), ctx.GetRunId(), "", t.lastSeq+1)
		if err := t.Store.Save(); err != nil { // persisted before the seq counts as handled
			return err
		}
	} else {
		t.dupFinals++
	}
	r := t.replies[f.GetReplyId()]
	if r == nil {
		r = &ReplyResult{ReplyID: f.GetReplyId(), MemberID: f.GetMemberId(), Step: f.GetStep(), Content: f.GetContent()}
		t.replies[f.GetReplyId()] = r
	}
	r.Persisted = r.Persisted || stored

	if t.open != f.GetReplyId() { // no speaker_started seen for it on this stream
		t.startLine(f.GetReplyId(), 0)
	}
	switch {
	case t.openText == "": // a replay has no deltas: show the final text
		fmt.Fprint(t.Out, f.GetContent())
	case strings.HasPrefix(f.GetContent(), t.openText):
		// The deltas showed the start (the server drops the last buffered delta when the
		// final follows at once): add the rest on the same line.
		fmt.Fprint(t.Out, f.GetContent()[len(t.openText):])
	default: // the deltas were cut by a re-attach, or replaced: show what counts
		t.endLine()
		fmt.Fprintf(t.Out, "   (final) %s\n", f.GetContent())
	}
	note := ""
	if f.GetFinishReason() == roundtablev1.FinishReason_FINISH_REASON_REPLACED {
		note = " [replaced]"
	}
	t.endLine()
	if stored {
		fmt.Fprintf(t.Out, "   ✓ persisted %s%s\n", f.GetReplyId(), note)
	} else {
		fmt.Fprintf(t.Out, "   = %s already persisted%s\n", f.GetReplyId(), note)
	}
	return nil
}

// finish records the terminal event.
func (t *Turn) finish(status, msg string, seq uint64) error {
	t.terminal, t.terminalMsg = status, msg
	ctx := t.Request.GetContext()
	t.Store.UpdateRun(ctx.GetTenant(), ctx.GetRunId(), status, seq)
	return t.Store.Save()
}

// Replies returns the replies seen, in step order.
func (t *Turn) Replies() []ReplyResult {
	out := make([]ReplyResult, 0, len(t.replies))
	for _, r := range t.replies {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Step < out[j].Step })
	return out
}

// -- printing --------------------------------------------------------------------

func (t *Turn) name(memberID string) string {
	if n, ok := t.names[memberID]; ok {
		return n
	}
	return memberID
}

func (t *Turn) startLine(replyID string, attempt uint32) {
	t.endLine()
	retry := ""
	if attempt > 1 {
		retry = fmt.Sprintf(" (attempt %d)", attempt)
	}
	fmt.Fprintf(t.Out, "%s%s: ", t.name(t.speakers[replyID]), retry)
	t.open, t.openText = replyID, ""
}

func (t *Turn) printDelta(d *roundtablev1.AssistantDelta) {
	if t.open != d.GetReplyId() {
		t.startLine(d.GetReplyId(), d.GetAttempt())
	}
	fmt.Fprint(t.Out, d.GetText())
	t.openText += d.GetText()
}

// endLine ends the speaker line being printed, if any.
func (t *Turn) endLine() {
	if t.open != "" {
		fmt.Fprintln(t.Out)
		t.open, t.openText = "", ""
	}
}

func enumName(name, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(name, prefix))
}
