package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	roundtablev1 "github.com/roundtable/roundtable/clients/go/roundtable/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// fakeSidecar streams a fixed log for StartRun, holding it at the permission request until
// a decision arrives (as the real run waits), and answers GetRun and ResolvePermission. A
// denial it records ends the call DENIED in the reply, as the real run's does.
type fakeSidecar struct {
	roundtablev1.OrchestratorServiceClient // other calls are not made

	events  []*roundtablev1.RunEvent
	waitAt  int // Recv waits before events[waitAt] for a decision (0: it never waits)
	pending bool
	stuck   bool // a decision does not let the run go on (it was never recorded)
	answer  func(*roundtablev1.ResolvePermissionRequest) (*roundtablev1.ResolvePermissionResponse, error)

	mu       sync.Mutex
	resolved []*roundtablev1.ResolvePermissionRequest
	decided  chan struct{}
	once     sync.Once
}

func (f *fakeSidecar) StartRun(ctx context.Context, _ *roundtablev1.StartRunRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[roundtablev1.StartRunResponse], error) {
	return &fakeStream{ctx: ctx, f: f}, nil
}

func (f *fakeSidecar) GetRun(_ context.Context, in *roundtablev1.GetRunRequest, _ ...grpc.CallOption) (*roundtablev1.GetRunResponse, error) {
	run := &roundtablev1.Run{RunId: in.GetRunId(), Tenant: in.GetTenant(), Status: roundtablev1.RunStatus_RUN_STATUS_AWAITING_APPROVAL}
	if f.pending {
		run.PendingPermissions = []*roundtablev1.PermissionRequired{f.events[f.waitAt-1].GetPermissionRequired()}
	}
	return &roundtablev1.GetRunResponse{Run: run}, nil
}

func (f *fakeSidecar) ResolvePermission(_ context.Context, in *roundtablev1.ResolvePermissionRequest, _ ...grpc.CallOption) (*roundtablev1.ResolvePermissionResponse, error) {
	f.mu.Lock()
	f.resolved = append(f.resolved, in)
	f.mu.Unlock()
	resp, err := f.answer(in)
	if err == nil && in.GetDecision() == roundtablev1.PermissionDecision_PERMISSION_DECISION_DENY {
		f.events = approvalLog(roundtablev1.ToolCallOutcome_TOOL_CALL_OUTCOME_DENIED) // read after decided closes
	}
	if !f.stuck {
		f.once.Do(func() { close(f.decided) })
	}
	return resp, err
}

type fakeStream struct {
	grpc.ServerStreamingClient[roundtablev1.StartRunResponse]
	ctx  context.Context
	f    *fakeSidecar
	next int
}

func (s *fakeStream) Recv() (*roundtablev1.StartRunResponse, error) {
	if s.f.waitAt > 0 && s.next == s.f.waitAt {
		select {
		case <-s.f.decided:
		case <-s.ctx.Done():
			return nil, status.FromContextError(s.ctx.Err()).Err()
		}
	}
	if s.next >= len(s.f.events) {
		return nil, io.EOF
	}
	s.next++
	return &roundtablev1.StartRunResponse{Event: s.f.events[s.next-1]}, nil
}

// approvalLog is Mei's reply that calls note: it waits for a decision after event 4.
func approvalLog(outcome roundtablev1.ToolCallOutcome) []*roundtablev1.RunEvent {
	ev := func(seq uint64, e *roundtablev1.RunEvent) *roundtablev1.RunEvent { e.Seq = seq; return e }
	return []*roundtablev1.RunEvent{
		ev(1, &roundtablev1.RunEvent{Payload: &roundtablev1.RunEvent_RunStarted{RunStarted: &roundtablev1.RunStarted{}}}),
		ev(2, &roundtablev1.RunEvent{Payload: &roundtablev1.RunEvent_PlanCreated{PlanCreated: &roundtablev1.PlanCreated{
			Steps: []*roundtablev1.PlanStep{{MemberId: "mei", ReplyId: "r1#0"}}, Round: 1}}}),
		ev(3, &roundtablev1.RunEvent{Payload: &roundtablev1.RunEvent_SpeakerStarted{SpeakerStarted: &roundtablev1.SpeakerStarted{
			MemberId: "mei", ReplyId: "r1#0", Attempt: 1}}}),
		ev(4, &roundtablev1.RunEvent{Payload: &roundtablev1.RunEvent_PermissionRequired{PermissionRequired: &roundtablev1.PermissionRequired{
			PermissionRequestId: "r1#0/1", MemberId: "mei", Action: "note", ToolName: "note", ReplyId: "r1#0",
			ArgumentsJson: `{"text": "buy milk"}`, ExpiresAt: timestamppb.New(time.Now().Add(time.Hour))}}}),
		ev(5, &roundtablev1.RunEvent{Payload: &roundtablev1.RunEvent_AssistantFinal{AssistantFinal: &roundtablev1.AssistantFinal{
			ReplyId: "r1#0", MemberId: "mei", Content: "done",
			ToolCalls: []*roundtablev1.ToolCallSummary{{CallId: "r1#0/1", ToolName: "note", Outcome: outcome}}}}}),
		ev(6, &roundtablev1.RunEvent{Payload: &roundtablev1.RunEvent_RunCompleted{RunCompleted: &roundtablev1.RunCompleted{
			Replies: []*roundtablev1.ReplySummary{{ReplyId: "r1#0", MemberId: "mei"}}}}}),
	}
}

func approvedAnswer(in *roundtablev1.ResolvePermissionRequest) (*roundtablev1.ResolvePermissionResponse, error) {
	return &roundtablev1.ResolvePermissionResponse{Decision: in.GetDecision(), DecidedAt: timestamppb.Now()}, nil
}

func refusal(code codes.Code, reason, msg string) func(*roundtablev1.ResolvePermissionRequest) (*roundtablev1.ResolvePermissionResponse, error) {
	return func(*roundtablev1.ResolvePermissionRequest) (*roundtablev1.ResolvePermissionResponse, error) {
		st := status.New(code, msg)
		if reason != "" {
			st, _ = st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: "roundtable.v1"})
		}
		return nil, st.Err()
	}
}

type approvalCase struct {
	approve string
	input   string
	pending bool
	stuck   bool
	answer  func(*roundtablev1.ResolvePermissionRequest) (*roundtablev1.ResolvePermissionResponse, error)
}

// runApproval runs one turn of approvalLog against the fake; it returns the turn, its
// error, what it printed, the decisions sent and the store.
func runApproval(t *testing.T, c approvalCase) (*Turn, error, string, []*roundtablev1.ResolvePermissionRequest, *Store) {
	t.Helper()
	f := &fakeSidecar{events: approvalLog(roundtablev1.ToolCallOutcome_TOOL_CALL_OUTCOME_OK), waitAt: 4,
		pending: c.pending, stuck: c.stuck, answer: c.answer, decided: make(chan struct{})}
	if !c.pending { // a replay: nothing waits
		f.waitAt = 0
	}
	store, err := OpenStore(filepath.Join(t.TempDir(), "gw.json"))
	if err != nil {
		t.Fatal(err)
	}
	req := &roundtablev1.StartRunRequest{
		Context:  &roundtablev1.RunContext{RunId: "r1", ThreadId: "th", Tenant: "demo"},
		Snapshot: &roundtablev1.Snapshot{Members: []*roundtablev1.Member{{MemberId: "mei", DisplayName: "Mei"}}},
	}
	store.AddRun(StoredRun{Tenant: "demo", RunID: "r1", ThreadID: "th"}, "@Mei use note to buy milk")
	out := &bytes.Buffer{}
	turn := &Turn{
		Client: f, Request: req, Store: store, Out: out, MaxFailures: 1,
		Memory:  &MemoryRules{Store: store, Tenant: "demo", RunID: "r1"},
		Approve: c.approve, Prompt: &Prompter{In: strings.NewReader(c.input), Echo: true},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = turn.Run(ctx)
	return turn, err, out.String(), f.resolved, store
}

func TestApprovalDecidedByFlagOrByThePerson(t *testing.T) {
	approve, deny := roundtablev1.PermissionDecision_PERMISSION_DECISION_APPROVE, roundtablev1.PermissionDecision_PERMISSION_DECISION_DENY
	for name, c := range map[string]struct {
		approvalCase
		decision   roundtablev1.PermissionDecision
		reason     string
		by, output string
		outcome    string // the call's outcome in Mei's reply
	}{
		"always":                    {approvalCase{approve: ApproveAlways}, approve, "", "-approve=always", "✓ Mei's note approved (-approve=always)", "ok"},
		"never":                     {approvalCase{approve: ApproveNever}, deny, "the gateway allows no such call (-approve=never)", "-approve=never", "✗ Mei's note denied (-approve=never)", "denied"},
		"ask yes":                   {approvalCase{approve: ApproveAsk, input: "perhaps\nY\n"}, approve, "", "terminal", "please answer y or n: Y\n   ✓ Mei's note approved (terminal)", "ok"},
		"ask no":                    {approvalCase{approve: ApproveAsk, input: "n\n  not on a Friday \n"}, deny, "not on a Friday", "terminal", "✗ Mei's note denied (terminal): not on a Friday", "denied"},
		"ask no, then stdin closed": {approvalCase{approve: ApproveAsk, input: "no"}, deny, "", "terminal", "✗ Mei's note denied (terminal)\n", "denied"},
	} {
		t.Run(name, func(t *testing.T) {
			c.pending, c.answer = true, approvedAnswer
			turn, err, out, sent, store := runApproval(t, c.approvalCase)
			if err != nil || turn.terminal != "completed" {
				t.Fatalf("turn: %v %q\n%s", err, turn.terminal, out)
			}
			if len(sent) != 1 || sent[0].GetDecision() != c.decision || sent[0].GetReason() != c.reason ||
				sent[0].GetPermissionRequestId() != "r1#0/1" || sent[0].GetRunId() != "r1" || sent[0].GetTenant() != "demo" {
				t.Fatalf("sent %v", sent)
			}
			if !strings.Contains(out, c.output) || !strings.Contains(out, "── Mei wants to run note {\"text\": \"buy milk\"} (request r1#0/1") ||
				!strings.Contains(out, "Mei used note: "+c.outcome+"\n") {
				t.Fatalf("output:\n%s", out)
			}
			got := turn.Permissions()
			if len(got) != 1 || got[0].Result != "recorded" || got[0].DecidedBy != c.by || got[0].ToolName != "note" {
				t.Fatalf("permissions %+v", got)
			}
			if d := store.Decision("demo", "r1", "r1#0/1"); d == nil || d.DecidedBy != c.by || d.ArgumentsJSON != `{"text": "buy milk"}` {
				t.Fatalf("stored decision %+v", d)
			}
			if r := turn.Replies(); len(r) != 1 || len(r[0].ToolCalls) != 1 || r[0].ToolCalls[0].Outcome != c.outcome {
				t.Fatalf("replies %+v", r)
			}
			if m := store.Reply("demo", "r1", "r1#0"); m == nil || len(m.ToolCalls) != 1 || m.ToolCalls[0].CallID != "r1#0/1" {
				t.Fatalf("stored reply %+v", m)
			}
		})
	}
}

// The gateway acts on the ErrorInfo reason of a refusal, not on its code.
func TestApprovalRefusalsByReason(t *testing.T) {
	for name, c := range map[string]struct {
		answer  func(*roundtablev1.ResolvePermissionRequest) (*roundtablev1.ResolvePermissionResponse, error)
		result  string
		output  string
		aborted bool
	}{
		"decided first": {refusal(codes.FailedPrecondition, "PERMISSION_DECIDED", "r1#0/1 is recorded as deny"),
			"already_decided", "= too late, already decided: r1#0/1 is recorded as deny", false},
		"not found": {refusal(codes.NotFound, "PERMISSION_NOT_FOUND", "no such request"),
			"not_found", "✗ Roundtable knows no such request", false},
		"a bare FAILED_PRECONDITION": {refusal(codes.FailedPrecondition, "", "something else"),
			"failed", "✗ ResolvePermission failed", true},
		"another reason of the same code": {refusal(codes.NotFound, "RUN_NOT_FOUND", "no such run"),
			"failed", "✗ ResolvePermission failed", true},
	} {
		t.Run(name, func(t *testing.T) {
			turn, err, out, sent, store := runApproval(t, approvalCase{approve: ApproveAlways, pending: true, stuck: c.aborted, answer: c.answer})
			if len(sent) != 1 {
				t.Fatalf("sent %v", sent)
			}
			if got := turn.Permissions(); len(got) != 1 || got[0].Result != c.result || got[0].Decision != "approve" {
				t.Fatalf("permissions %+v", got)
			}
			if !strings.Contains(out, c.output) {
				t.Fatalf("output:\n%s", out)
			}
			if c.aborted {
				if err == nil || !strings.Contains(err.Error(), "could not send the decision on r1#0/1") ||
					!strings.Contains(err.Error(), "-run-id r1") {
					t.Fatalf("want the turn aborted, got %v", err)
				}
				return
			}
			if err != nil || turn.terminal != "completed" {
				t.Fatalf("turn: %v\n%s", err, out)
			}
			if store.Decision("demo", "r1", "r1#0/1") != nil {
				t.Fatal("a decision Roundtable did not record was stored")
			}
		})
	}
}

func TestApprovalOfARequestNoLongerPendingIsNotAsked(t *testing.T) {
	turn, err, out, sent, _ := runApproval(t, approvalCase{approve: ApproveAsk, input: "y\n", pending: false, answer: approvedAnswer})
	if err != nil || turn.terminal != "completed" {
		t.Fatalf("turn: %v\n%s", err, out)
	}
	if len(sent) != 0 || strings.Contains(out, "allow Mei") {
		t.Fatalf("a replayed request was asked or decided: %v\n%s", sent, out)
	}
	if got := turn.Permissions(); len(got) != 1 || got[0].Result != "already_decided" || got[0].Decision != "" {
		t.Fatalf("permissions %+v", got)
	}
}

func TestApprovalWithStdinClosedEndsTheTurn(t *testing.T) {
	turn, err, out, sent, _ := runApproval(t, approvalCase{approve: ApproveAsk, input: "", pending: true, answer: approvedAnswer})
	if err == nil || !strings.Contains(err.Error(), "no answer to permission request r1#0/1 (stdin closed)") || len(sent) != 0 {
		t.Fatalf("err %v, sent %v\n%s", err, sent, out)
	}
	if got := turn.Permissions(); len(got) != 1 || got[0].Result != "unanswered" {
		t.Fatalf("permissions %+v", got)
	}
}

func TestTurnClockDoesNotCountPausedTime(t *testing.T) {
	ctx, clock, cancel := WithTurnClock(context.Background(), 80*time.Millisecond)
	defer cancel()
	clock.Pause()
	time.Sleep(150 * time.Millisecond)
	if ctx.Err() != nil {
		t.Fatal("the clock ran while paused")
	}
	clock.Resume()
	select {
	case <-ctx.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the clock never fired")
	}
	if !errors.Is(context.Cause(ctx), context.DeadlineExceeded) || !strings.Contains(context.Cause(ctx).Error(), "-timeout") {
		t.Fatalf("cause %v", context.Cause(ctx))
	}
}
