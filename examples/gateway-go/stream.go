package main

// stream.go: one user turn, through the client library (clients/go/client). It sends
// StartRun; when the stream drops before a terminal event, StreamRun(after_seq = the last
// seq handled) re-attaches and nothing is lost: every event but a delta is durable in
// Roundtable's log, and its seq never changes, so the library skips by seq what was
// handled and yields each durable event once, in order.
//
// What the gateway persists is idempotent on its own keys as well: a final reply once
// per (run_id, reply_id), whatever replays, re-attaches or resumes deliver it again.
//
// A permission_required is decided on a goroutine of its own (approval.go) while this
// loop reads on; t.mu keeps their printing and storing apart.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"

	"github.com/roundtable/roundtable/clients/go/client"
	roundtablev1 "github.com/roundtable/roundtable/clients/go/roundtable/v1"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ReplyResult is one reply of the run as this process saw it.
type ReplyResult struct {
	ReplyID   string `json:"reply_id"`
	MemberID  string `json:"member_id"`
	Step      uint32 `json:"step"`
	Content   string `json:"content"`
	Persisted bool   `json:"persisted"` // stored by this process (false: it was stored before)
	// ToolCalls are the reply's tool calls and how each ended.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
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
	DropAfter   int        // test hook: close the first stream after this many durable events
	MaxFailures int        // consecutive failed attempts (without progress) before giving up
	Approve     string     // ask, always or never: how permission requests are decided
	Prompt      *Prompter  // the terminal, for Approve = ask
	Clock       *TurnClock // the turn's -timeout, paused while a person answers (nil: none)

	mu              sync.Mutex                         // the event loop vs. the deciders: output, store, the fields below
	abort           context.CancelCauseFunc            // ends the turn with an error, from a decider
	deciding        sync.WaitGroup                     // deciders running
	waiting         map[string]context.CancelCauseFunc // permission_request_id -> stops its decider
	permissions     map[string]*PermissionResult       // permission_request_id -> what became of it
	permissionOrder []string                           // permission request ids, in the order they came
	question        string                             // the question the person is being asked, if any
	questionCut     bool                               // something was printed below it since

	names       map[string]string // member_id -> display name
	speakers    map[string]string // reply_id -> member_id, from the plan
	lastSeq     uint64            // the last durable event handled
	reattaches  int               // StreamRun re-attaches
	resumed     bool
	terminal    string // completed, cancelled or failed, once a terminal event arrived
	terminalMsg string
	resumable   bool // the terminal event says the same StartRun would go on with the run
	replies     map[string]*ReplyResult
	accepted    []MemoryDecision
	rejected    []MemoryDecision
	failed      []SpeakerFailure
	skipped     int // durable events delivered again and ignored (by seq)
	dupFinals   int // finals of replies that were already persisted
	missing     []string
	open        string                // the reply whose line is being printed
	openText    string                // the delta text printed on that line
	openAttempt uint32                // the AssistantDelta.attempt of that text
	together    map[string]groupKey   // reply_id -> its parallel group, for groups of several
	groups      map[groupKey][]string // a group's reply ids, in plan order
	announced   map[groupKey]bool     // groups whose "answering at once" line is printed
}

// groupKey names a parallel group of a plan: its speakers answer at once, their events
// interleave, so their text is not streamed; each reply is printed whole when final.
type groupKey struct{ round, group uint32 }

// Run streams the turn through the client library (clients/go/client), which re-attaches,
// resends StartRun and backs off as clients/conformance.md says, and yields each durable
// event once, in seq order: this gateway only does what it does with each event.
func (t *Turn) Run(ctx context.Context) error {
	t.names, t.speakers, t.replies = map[string]string{}, map[string]string{}, map[string]*ReplyResult{}
	t.together, t.groups, t.announced = map[string]groupKey{}, map[groupKey][]string{}, map[groupKey]bool{}
	t.waiting, t.permissions = map[string]context.CancelCauseFunc{}, map[string]*PermissionResult{}
	if t.Prompt == nil {
		t.Prompt = &Prompter{In: strings.NewReader("")}
	}
	ctx, t.abort = context.WithCancelCause(ctx)
	defer t.abort(nil)
	defer t.stopDeciding() // before the abort above: a decider still asking ends here
	for _, m := range t.Request.GetSnapshot().GetMembers() {
		t.names[m.GetMemberId()] = m.GetDisplayName()
	}
	span := trace.SpanFromContext(ctx)
	opts := client.DefaultOptions()
	opts.MaxAttempts = t.MaxFailures + 1
	opts.OnSkip = func(*roundtablev1.RunEvent) { t.skipped++ }
	opts.OnRetry = func(r client.Retry) {
		t.mu.Lock()
		defer t.mu.Unlock()
		defer t.reask()
		t.endLine()
		switch {
		case r.Ended != nil:
			// Stopped by the sidecar's shutdown, or failed retryably: the same StartRun
			// resumes the run (finished speakers are kept), here or on a restarted sidecar.
			fmt.Fprintf(t.Out, "── the run can go on (%s); sending the same StartRun to resume it\n", t.terminalMsg)
			span.AddEvent("resume", trace.WithAttributes(attribute.String("cause", t.terminalMsg)))
		case r.Op == client.OpStartRun: // StartRun is idempotent on run_id
			span.AddEvent("retry_start_run", trace.WithAttributes(attribute.String("cause", r.Err.Error())))
			fmt.Fprintf(t.Out, "── StartRun failed (%v); sending it again\n", r.Err)
		default:
			t.reattaches++
			span.AddEvent("reattach", trace.WithAttributes(
				attribute.Int64("after_seq", int64(r.AfterSeq)), attribute.String("cause", r.Err.Error())))
			fmt.Fprintf(t.Out, "── stream lost (%v); re-attaching with StreamRun(after_seq=%d)\n", r.Err, r.AfterSeq)
		}
	}
	stub := t.Client
	if t.DropAfter > 0 {
		stub = &dropAfter{OrchestratorServiceClient: stub, after: t.DropAfter}
	}
	for ev, err := range client.Wrap(stub).RunTurn(ctx, t.Request, &opts) {
		if err != nil {
			if ctx.Err() != nil { // -timeout, Ctrl-C, or a decider that could not decide
				return fmt.Errorf("turn aborted after seq %d: %w", t.lastSeq, context.Cause(ctx))
			}
			return err
		}
		if err := t.handle(ctx, ev); err != nil {
			return err
		}
	}
	return nil
}

// handle does what the gateway does with one event.
func (t *Turn) handle(ctx context.Context, ev *roundtablev1.RunEvent) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	defer t.reask()
	if d := ev.GetAssistantDelta(); d != nil { // live only, never replayed: just show it
		if _, atOnce := t.together[d.GetReplyId()]; !atOnce {
			t.printDelta(d)
		}
		return nil
	}
	if err := t.apply(ctx, ev); err != nil {
		return err
	}
	t.lastSeq = ev.GetSeq()
	return nil
}

// dropAfter is the -drop-after test hook: the first StartRun stream fails, as a dropped
// connection would, after this many durable events.
type dropAfter struct {
	roundtablev1.OrchestratorServiceClient
	after int
	once  sync.Once
}

func (d *dropAfter) StartRun(ctx context.Context, in *roundtablev1.StartRunRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[roundtablev1.StartRunResponse], error) {
	stream, err := d.OrchestratorServiceClient.StartRun(ctx, in, opts...)
	if err != nil {
		return stream, err
	}
	first := false
	d.once.Do(func() { first = true })
	if !first {
		return stream, nil
	}
	return &droppingStream{ServerStreamingClient: stream, left: d.after}, nil
}

type droppingStream struct {
	grpc.ServerStreamingClient[roundtablev1.StartRunResponse]
	left int
}

func (s *droppingStream) Recv() (*roundtablev1.StartRunResponse, error) {
	if s.left == 0 {
		return nil, status.Error(codes.Unavailable, "stream closed by -drop-after")
	}
	r, err := s.ServerStreamingClient.Recv()
	if err == nil && r.GetEvent().GetAssistantDelta() == nil {
		s.left--
	}
	return r, err
}

// apply does what the gateway does with one durable event; t.mu is held.
func (t *Turn) apply(ctx context.Context, ev *roundtablev1.RunEvent) error {
	rc := t.Request.GetContext()
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
		size := map[groupKey]int{}
		for _, s := range plan.GetSteps() {
			t.speakers[s.GetReplyId()] = s.GetMemberId()
			who = append(who, t.name(s.GetMemberId()))
			if s.GetParallelGroup() > 0 {
				size[groupKey{s.GetRound(), s.GetParallelGroup()}]++
			}
		}
		for _, s := range plan.GetSteps() {
			if k := (groupKey{s.GetRound(), s.GetParallelGroup()}); size[k] > 1 && t.together[s.GetReplyId()] != k {
				t.together[s.GetReplyId()] = k
				t.groups[k] = append(t.groups[k], s.GetReplyId())
			}
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
		if k, atOnce := t.together[s.GetReplyId()]; atOnce {
			t.announce(k, s)
		} else {
			t.startLine(s.GetReplyId(), s.GetAttempt())
		}
	case *roundtablev1.RunEvent_AssistantFinal:
		t.settle(p.AssistantFinal.GetReplyId(), fmt.Errorf("%s's reply went on without it", t.name(p.AssistantFinal.GetMemberId())))
		return t.persistReply(p.AssistantFinal)
	case *roundtablev1.RunEvent_SpeakerFailed:
		f := p.SpeakerFailed
		t.settle(f.GetReplyId(), fmt.Errorf("%s failed", t.name(f.GetMemberId())))
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
		t.Store.UpdateRun(rc.GetTenant(), rc.GetRunId(), "", ev.GetSeq())
		return t.Store.Save()
	case *roundtablev1.RunEvent_PermissionRequired:
		t.requestPermission(ctx, p.PermissionRequired)
	case *roundtablev1.RunEvent_RunCompleted:
		done := p.RunCompleted
		t.settle("", errors.New("the run completed"))
		for _, r := range done.GetReplies() {
			if t.Store.Reply(rc.GetTenant(), rc.GetRunId(), r.GetReplyId()) == nil {
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
		t.resumable = c.GetReason() == client.ShutdownReason
		if !t.resumable { // a waiting call of a cancelled run counts as denied ("cancelled")
			t.settle("", fmt.Errorf("the run was cancelled (%s)", c.GetReason()))
		}
		return t.finish("cancelled", c.GetReason(), ev.GetSeq())
	case *roundtablev1.RunEvent_RunFailed:
		f := p.RunFailed
		t.endLine()
		fmt.Fprintf(t.Out, "── failed: %s %s (retryable: %t)\n", f.GetCode(), f.GetMessage(), f.GetRetryable())
		t.resumable = f.GetRetryable()
		if !t.resumable {
			t.settle("", errors.New("the run failed"))
		}
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
	var calls []ToolCall
	for _, c := range f.GetToolCalls() {
		calls = append(calls, ToolCall{
			CallID: c.GetCallId(), ToolName: c.GetToolName(), Outcome: enumName(c.GetOutcome().String(), "TOOL_CALL_OUTCOME_"),
		})
	}
	stored := t.Store.PutReply(Message{
		Tenant: ctx.GetTenant(), ThreadID: ctx.GetThreadId(), RunID: ctx.GetRunId(),
		ReplyID: f.GetReplyId(), MemberID: f.GetMemberId(), Step: f.GetStep(), Content: f.GetContent(),
		Model: f.GetModel(), FinishReason: enumName(f.GetFinishReason().String(), "FINISH_REASON_"), ToolCalls: calls,
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
		r = &ReplyResult{ReplyID: f.GetReplyId(), MemberID: f.GetMemberId(), Step: f.GetStep(), Content: f.GetContent(), ToolCalls: calls}
		t.replies[f.GetReplyId()] = r
	}
	r.Persisted = r.Persisted || stored

	if _, atOnce := t.together[f.GetReplyId()]; atOnce {
		t.startLine(f.GetReplyId(), 0) // its whole reply, on a line of its own
	} else if t.open != f.GetReplyId() { // no speaker_started seen for it on this stream
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
	for _, c := range calls { // "Mei used weather: ok"
		fmt.Fprintf(t.Out, "   %s used %s: %s\n", t.name(f.GetMemberId()), c.ToolName, c.Outcome)
	}
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

// announce prints, once per group, who answers at once (and any later attempt of one).
func (t *Turn) announce(k groupKey, s *roundtablev1.SpeakerStarted) {
	t.endLine()
	if s.GetAttempt() > 1 {
		fmt.Fprintf(t.Out, "   (%s: attempt %d)\n", t.name(s.GetMemberId()), s.GetAttempt())
	}
	if t.announced[k] {
		return
	}
	t.announced[k] = true
	var names []string
	for _, replyID := range t.groups[k] {
		names = append(names, t.name(t.speakers[replyID]))
	}
	fmt.Fprintf(t.Out, "── answering at once: %s\n", strings.Join(names, ", "))
}

func (t *Turn) printDelta(d *roundtablev1.AssistantDelta) {
	if t.open != d.GetReplyId() {
		t.startLine(d.GetReplyId(), 0) // AssistantDelta.attempt is no speaker attempt: no label
	} else if t.openText != "" && d.GetAttempt() != t.openAttempt {
		// The reply's text starts over (a model call retried, a count-off asked again):
		// the chunks shown so far are dropped, so the new text gets a line of its own.
		fmt.Fprint(t.Out, "\n   (again) ")
		t.openText = ""
	}
	t.openAttempt = d.GetAttempt()
	fmt.Fprint(t.Out, d.GetText())
	t.openText += d.GetText()
}

// endLine ends the speaker line being printed, if any.
func (t *Turn) endLine() {
	if t.open != "" {
		fmt.Fprintln(t.Out)
		t.open, t.openText = "", ""
	}
	if t.question != "" && !t.questionCut { // a question waits for its answer on this line
		fmt.Fprintln(t.Out)
		t.questionCut = true
	}
}

// reask shows the question waiting for an answer again, below what was printed after it.
func (t *Turn) reask() {
	if t.questionCut {
		fmt.Fprint(t.Out, t.question)
		t.questionCut = false
	}
}

func enumName(name, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(name, prefix))
}
