package client_test

// The scenarios of clients/conformance.md, each against a real `roundtable serve`.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/roundtable/roundtable/clients/go/client"
	roundtablev1 "github.com/roundtable/roundtable/clients/go/roundtable/v1"
	"google.golang.org/grpc/codes"
)

// turnOf runs one turn through the library; onEvent sees each durable event as it is yielded.
func turnOf(ctx context.Context, t *testing.T, c *client.Client, req *roundtablev1.StartRunRequest,
	opts *client.Options, onEvent func(*roundtablev1.RunEvent, *collected)) *collected {
	t.Helper()
	col := &collected{}
	var mu sync.Mutex
	o := client.DefaultOptions()
	if opts != nil {
		o = *opts
	}
	o.OnRetry = func(r client.Retry) {
		mu.Lock()
		defer mu.Unlock()
		var last uint64
		if n := len(col.events); n > 0 {
			last = col.events[n-1].GetSeq()
		}
		col.retries = append(col.retries, retryRecord{op: string(r.Op), afterSeq: r.AfterSeq, lastSeen: last, err: r.Err, ended: r.Ended != nil})
		t.Logf("retry: %s after_seq=%d attempt=%d delay=%s err=%v ended=%v", r.Op, r.AfterSeq, r.Attempt, r.Delay, r.Err, r.Ended != nil)
	}
	for ev, err := range c.RunTurn(ctx, req, &o) {
		if err != nil {
			col.err = err
			break
		}
		if ev.GetAssistantDelta() != nil {
			col.deltas++
			continue
		}
		mu.Lock()
		col.events = append(col.events, ev)
		mu.Unlock()
		if onEvent != nil {
			onEvent(ev, col)
		}
	}
	return col
}

func connect(t *testing.T, target string, o client.DialOptions) *client.Client {
	t.Helper()
	conn, err := client.Dial(target, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return client.New(conn)
}

// patient retries long enough to outlast a sidecar restart.
func patient() *client.Options {
	o := client.DefaultOptions()
	o.MaxAttempts, o.MaxBackoff = 30, time.Second
	return &o
}

func TestC1CleanTurn(t *testing.T) {
	server := startSidecar(t, "--offline-token-delay-ms", "2")
	c := connect(t, server.address(), client.DialOptions{})
	col := turnOf(ctxFor(t, time.Minute), t, c, demoRequest("c1", "t-c1", "大家报数！"), nil, nil)
	col.checkCompletedOnce(t)
	if col.events[0].GetRunStarted() == nil || col.events[1].GetPlanCreated() == nil {
		t.Fatalf("does not start run_started, plan_created: %v", col.kinds())
	}
	for i, f := range col.finals() {
		if !strings.Contains(f.GetContent(), fmt.Sprint(i+1)) {
			t.Fatalf("final %d of the count-off says %q", i+1, f.GetContent())
		}
	}
	if len(col.retries) != 0 {
		t.Fatalf("a clean turn retried: %+v", col.retries)
	}
	run, err := c.GetRun(ctxFor(t, 10*time.Second), "c1", "demo")
	if err != nil || run.GetStatus() != roundtablev1.RunStatus_RUN_STATUS_SUCCEEDED || run.GetLastSeq() != col.events[len(col.events)-1].GetSeq() {
		t.Fatalf("GetRun: %v, %v", run, err)
	}
}

func TestC2StreamCut(t *testing.T) {
	server := startSidecar(t, "--offline-token-delay-ms", "5")
	// k = 1: the proxy cuts after the first message on the wire (the library may not have
	// yielded it yet). 3: cut as the caller sees its 3rd event; -2: as it sees the 2nd
	// final. Counted on the wire, a cut can take messages the library had received but not
	// yet yielded, and it then rightly starts again.
	for _, k := range []int{1, 3, -2} {
		name := map[int]string{1: "after_1_message", 3: "after_3rd_event", -2: "after_2nd_final"}[k]
		t.Run(name, func(t *testing.T) {
			wire := 0
			if k == 1 {
				wire = 1
			}
			proxy := startProxy(t, server.address(), wire)
			c := connect(t, proxy.address(), client.DialOptions{})
			runID := "c2-" + name
			events, finals := 0, 0
			col := turnOf(ctxFor(t, time.Minute), t, c, demoRequest(runID, "t-"+runID, "@all tell me about your day"), nil,
				func(ev *roundtablev1.RunEvent, _ *collected) {
					if events++; k == 3 && events == 3 {
						proxy.Cut()
					}
					if ev.GetAssistantFinal() != nil {
						if finals++; k < 0 && finals == -k {
							proxy.Cut()
						}
					}
				})
			col.checkCompletedOnce(t)
			if proxy.Cuts() == 0 {
				t.Fatal("the proxy never cut")
			}
			reattached := false
			for _, r := range col.retries {
				if r.lastSeen > 0 && (r.op != string(client.OpStreamRun) || r.afterSeq != r.lastSeen) {
					t.Fatalf("after seq %d the library sent %s(after_seq=%d)", r.lastSeen, r.op, r.afterSeq)
				}
				reattached = reattached || r.op == string(client.OpStreamRun)
			}
			if !reattached && k != 1 {
				t.Fatalf("no StreamRun re-attach: %+v", col.retries)
			}
			if len(col.retries) == 0 {
				t.Fatal("no retry after the cut")
			}
		})
	}
}

// restartMidTurn runs a turn and, after its 2nd assistant_final, stops the sidecar with sig
// and starts it again on the same port and database.
func restartMidTurn(t *testing.T, sig syscall.Signal, runID string) *collected {
	server := startSidecar(t, "--offline-token-delay-ms", "10", "--grace-seconds", "5")
	c := connect(t, server.address(), client.DialOptions{})
	finals := 0
	var restarted sync.WaitGroup
	var restartErr error
	col := turnOf(ctxFor(t, 90*time.Second), t, c, demoRequest(runID, "t-"+runID, "@all tell me about your day"), patient(),
		func(ev *roundtablev1.RunEvent, _ *collected) {
			if ev.GetAssistantFinal() != nil {
				if finals++; finals == 2 {
					server.signal(sig) // waits for the exit
					restarted.Add(1)
					go func() { defer restarted.Done(); restartErr = server.start() }()
				}
			}
		})
	restarted.Wait()
	if restartErr != nil {
		t.Fatal(restartErr)
	}
	col.checkCompletedOnce(t)
	resent := false
	for _, r := range col.retries {
		resent = resent || r.op == string(client.OpStartRun)
	}
	if !resent {
		t.Fatalf("the library never sent StartRun again: %+v", col.retries)
	}
	return col
}

func TestC3SigkillRestart(t *testing.T) {
	col := restartMidTurn(t, syscall.SIGKILL, "c3")
	resumed := false
	for _, ev := range col.events {
		resumed = resumed || ev.GetRunStarted().GetResumed()
	}
	if !resumed {
		t.Fatalf("no resumed execution: %v", col.kinds())
	}
}

func TestC4GracefulShutdownRestart(t *testing.T) {
	col := restartMidTurn(t, syscall.SIGTERM, "c4")
	shutdown := false
	for _, ev := range col.events {
		shutdown = shutdown || ev.GetRunCancelled().GetReason() == client.ShutdownReason
	}
	if !shutdown {
		t.Fatalf("no run_cancelled server_shutdown: %v", col.kinds())
	}
	for _, r := range col.retries {
		if r.ended && r.op != string(client.OpStartRun) {
			t.Fatalf("a resumable end retried with %s", r.op)
		}
	}
}

func TestC5ResourceExhausted(t *testing.T) {
	server := startSidecar(t, "--offline-token-delay-ms", "25", "--max-runs", "1")
	c := connect(t, server.address(), client.DialOptions{})
	ctx := ctxFor(t, 90*time.Second)

	// Another long run holds the only slot.
	holderStarted := make(chan struct{})
	holderDone := make(chan *collected, 1)
	go func() {
		once := sync.Once{}
		holderDone <- turnOf(ctx, t, c, demoRequest("c5-holder", "t-c5-holder", "@all tell me about your day"), nil,
			func(*roundtablev1.RunEvent, *collected) { once.Do(func() { close(holderStarted) }) })
	}()
	<-holderStarted

	// (b) Too few attempts to outlast it: a typed TOO_MANY_RUNS.
	few := client.DefaultOptions()
	few.MaxAttempts = 2
	refused := turnOf(ctx, t, c, demoRequest("c5-refused", "t-c5-refused", "大家报数！"), &few, nil)
	var e *client.Error
	if !errors.Is(refused.err, client.ErrAttemptsExhausted) || !errors.As(refused.err, &e) {
		t.Fatalf("want attempts exhausted with a typed error, got %v", refused.err)
	}
	if e.Code != codes.ResourceExhausted || e.Reason != client.ReasonTooManyRuns || !e.HasRetryDelay || e.RetryDelay <= 0 || e.Attempts != 2 || !e.Retryable {
		t.Fatalf("error %+v", e)
	}
	if !errors.Is(refused.err, &client.Error{Reason: client.ReasonTooManyRuns}) {
		t.Fatal("errors.Is by reason does not match")
	}
	if len(refused.events) != 0 || len(refused.retries) != 1 || refused.retries[0].op != string(client.OpStartRun) {
		t.Fatalf("refused turn: %v %+v", refused.kinds(), refused.retries)
	}

	// (a) Patient: it waits per RetryInfo, and completes once the slot frees.
	waited := turnOf(ctx, t, c, demoRequest("c5-waits", "t-c5-waits", "大家报数！"), patient(), nil)
	waited.checkCompletedOnce(t)
	if len(waited.retries) == 0 {
		t.Fatal("the second run never waited for the slot")
	}
	for _, r := range waited.retries {
		if !errors.Is(r.err, &client.Error{Reason: client.ReasonTooManyRuns}) || r.op != string(client.OpStartRun) {
			t.Fatalf("retry %+v", r)
		}
	}
	(<-holderDone).checkCompletedOnce(t)
}

func TestC6InvalidArgument(t *testing.T) {
	server := startSidecar(t)
	c := connect(t, server.address(), client.DialOptions{})
	req := demoRequest("c6", "t-c6", "@nobody hello")
	req.Snapshot.Session.PrimaryMemberId = "ghost"                   // no such member
	req.Snapshot.Members[1].MemberId = "lin"                         // a duplicate id
	req.Snapshot.UserTurn.Mentions = []string{"nobody-with-this-id"} // names no member
	col := turnOf(ctxFor(t, 30*time.Second), t, c, req, nil, nil)
	var e *client.Error
	if !errors.As(col.err, &e) || errors.Is(col.err, client.ErrAttemptsExhausted) {
		t.Fatalf("want a typed error, got %v", col.err)
	}
	if e.Code != codes.InvalidArgument || e.Reason != client.ReasonInvalidRequest || e.Retryable || e.Attempts != 1 || len(col.retries) != 0 {
		t.Fatalf("error %+v, retries %+v", e, col.retries)
	}
	fields := map[string]bool{}
	for _, v := range e.Violations {
		fields[v.Field] = true
		if v.Description == "" {
			t.Fatalf("violation without a description: %+v", v)
		}
	}
	for _, want := range []string{"snapshot.session.primary_member_id", "snapshot.members[1].member_id", "snapshot.user_turn.mentions[0]"} {
		if !fields[want] {
			t.Fatalf("no violation for %s in %+v", want, e.Violations)
		}
	}
}

func TestC7TokenOverTLS(t *testing.T) {
	cert, key, certPEM := selfSigned(t)
	server := startSidecar(t, "--tls-cert-file", cert, "--tls-key-file", key, "--auth-tokens", "tok-right=demo")
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(certPEM)
	secure := func(token string) *client.Client {
		return connect(t, server.address(), client.DialOptions{
			TLS: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, Token: token,
		})
	}
	col := turnOf(ctxFor(t, time.Minute), t, secure("tok-right"), demoRequest("c7", "t-c7", "大家报数！"), nil, nil)
	col.checkCompletedOnce(t)

	wrong := turnOf(ctxFor(t, 30*time.Second), t, secure("tok-wrong"), demoRequest("c7-wrong", "t-c7-wrong", "大家报数！"), nil, nil)
	var e *client.Error
	if !errors.As(wrong.err, &e) || errors.Is(wrong.err, client.ErrAttemptsExhausted) {
		t.Fatalf("want a typed error, got %v", wrong.err)
	}
	if e.Code != codes.Unauthenticated || e.Reason != client.ReasonUnauthenticated || e.Retryable || e.Attempts != 1 || len(wrong.retries) != 0 {
		t.Fatalf("error %+v, retries %+v", e, wrong.retries)
	}
	if strings.Contains(e.Error(), "tok-wrong") {
		t.Fatal("the error names the token")
	}
}

// C8: a tool call that needs approval. The turn's stream stays open while the run waits;
// ResolvePermission decides, and the same stream goes on to the reply.
func TestC8PermissionApproval(t *testing.T) {
	tools := startToolServer(t)
	server := startSidecar(t, "--offline-token-delay-ms", "2")
	c := connect(t, server.address(), client.DialOptions{})
	ctx := ctxFor(t, time.Minute)
	approve, deny := roundtablev1.PermissionDecision_PERMISSION_DECISION_APPROVE, roundtablev1.PermissionDecision_PERMISSION_DECISION_DENY

	// (a) Approved: the tool runs once, the reply quotes it, its final lists the call.
	var asked *roundtablev1.PermissionRequired
	col := turnOf(ctx, t, c, toolRequest("c8", "t-c8", "@Mei use note to buy milk", tools.url()), nil,
		func(ev *roundtablev1.RunEvent, _ *collected) {
			p := ev.GetPermissionRequired()
			if p == nil {
				return
			}
			asked = p
			run, err := c.GetRun(ctx, "c8", "demo")
			if err != nil || len(run.GetPendingPermissions()) != 1 || run.GetPendingPermissions()[0].GetPermissionRequestId() != p.GetPermissionRequestId() {
				t.Errorf("GetRun while waiting: %v, %v", run, err)
			}
			resp, err := c.ResolvePermission(ctx, "c8", "demo", p.GetPermissionRequestId(), approve, "", "")
			if err != nil || resp.GetDecision() != approve || resp.GetRun().GetRunId() != "c8" || resp.GetDecidedAt() == nil {
				t.Errorf("ResolvePermission: %v, %v", resp, err)
			}
		})
	if col.err != nil {
		t.Fatalf("turn failed: %v (%v)", col.err, col.kinds())
	}
	if asked == nil || asked.GetMemberId() != "mei" || asked.GetToolName() != "note" || asked.GetArgumentsJson() == "" ||
		asked.GetArguments().GetFields()["text"].GetStringValue() != "buy milk" || asked.GetExpiresAt() == nil {
		t.Fatalf("permission_required: %v", asked)
	}
	if kinds := col.kinds(); kinds[len(kinds)-1] != "run_completed" {
		t.Fatalf("not ended by run_completed: %v", kinds)
	}
	finals := col.finals()
	if len(finals) != 1 || !strings.Contains(finals[0].GetContent(), "noted 'buy milk'") {
		t.Fatalf("finals %v", finals)
	}
	calls := finals[0].GetToolCalls()
	if len(calls) != 1 || calls[0].GetCallId() != asked.GetPermissionRequestId() || calls[0].GetToolName() != "note" ||
		calls[0].GetOutcome() != roundtablev1.ToolCallOutcome_TOOL_CALL_OUTCOME_OK {
		t.Fatalf("tool calls %v", calls)
	}
	// The tool server sees the call's idempotency key: <tenant>/<run_id>/<request id>.
	if n := tools.counts(t)["note"]["demo/c8/"+asked.GetPermissionRequestId()]; n != 1 {
		t.Fatalf("note ran %d times", n)
	}

	// (b) Decided: the same decision again answers the same; the other one, an unknown
	// request and an unknown run are typed errors, never retried.
	again, err := c.ResolvePermission(ctx, "c8", "demo", asked.GetPermissionRequestId(), approve, "", "")
	if err != nil || again.GetDecision() != approve {
		t.Fatalf("the same decision again: %v, %v", again, err)
	}
	for _, tc := range []struct {
		run, id string
		code    codes.Code
		reason  string
	}{
		{"c8", asked.GetPermissionRequestId(), codes.FailedPrecondition, client.ReasonPermissionDecided},
		{"c8", "c8#0/9", codes.NotFound, client.ReasonPermissionNotFound},
		{"no-such-run", "x#0/1", codes.NotFound, client.ReasonRunNotFound},
	} {
		_, err := c.ResolvePermission(ctx, tc.run, "demo", tc.id, deny, "too late", "")
		var e *client.Error
		if !errors.As(err, &e) || e.Code != tc.code || e.Reason != tc.reason || e.Retryable {
			t.Fatalf("ResolvePermission(%s, %s): %v", tc.run, tc.id, err)
		}
		if tc.reason == client.ReasonPermissionDecided && !strings.Contains(e.Message, "approve") {
			t.Fatalf("PERMISSION_DECIDED does not name the recorded decision: %v", e)
		}
	}

	// (c) Denied: the tool never runs, the member is told, the final says DENIED.
	var denied string
	col = turnOf(ctx, t, c, toolRequest("c8-deny", "t-c8-deny", "@Mei use note to sell the car", tools.url()), nil,
		func(ev *roundtablev1.RunEvent, _ *collected) {
			if p := ev.GetPermissionRequired(); p != nil {
				denied = p.GetPermissionRequestId()
				if _, err := c.ResolvePermission(ctx, "c8-deny", "demo", denied, deny, "not today", ""); err != nil {
					t.Errorf("deny: %v", err)
				}
			}
		})
	finals = col.finals()
	if col.err != nil || len(finals) != 1 || len(finals[0].GetToolCalls()) != 1 ||
		finals[0].GetToolCalls()[0].GetOutcome() != roundtablev1.ToolCallOutcome_TOOL_CALL_OUTCOME_DENIED {
		t.Fatalf("denied turn: %v %v %v", col.err, col.kinds(), finals)
	}
	if n := tools.counts(t)["note"]["demo/c8-deny/"+denied]; denied == "" || n != 0 {
		t.Fatalf("a denied note ran %d times (%q)", n, denied)
	}
}

// A run waiting for approval whose stream is cut is re-attached (StreamRun after the
// permission_required), waits on, and goes on once decided: the request is yielded once.
func TestApprovalWaitSurvivesACut(t *testing.T) {
	tools := startToolServer(t)
	server := startSidecar(t, "--offline-token-delay-ms", "2")
	proxy := startProxy(t, server.address(), 0)
	viaProxy := connect(t, proxy.address(), client.DialOptions{})
	direct := connect(t, server.address(), client.DialOptions{})
	ctx := ctxFor(t, time.Minute)
	decided := make(chan error, 1)
	col := turnOf(ctx, t, viaProxy, toolRequest("cut-wait", "t-cut-wait", "@Mei use note to buy milk", tools.url()), nil,
		func(ev *roundtablev1.RunEvent, _ *collected) {
			if p := ev.GetPermissionRequired(); p != nil {
				proxy.Cut()
				go func() { // decided a while after the cut, while the turn re-attaches and waits
					time.Sleep(500 * time.Millisecond)
					_, err := direct.ResolvePermission(ctx, "cut-wait", "demo", p.GetPermissionRequestId(),
						roundtablev1.PermissionDecision_PERMISSION_DECISION_APPROVE, "", "")
					decided <- err
				}()
			}
		})
	select {
	case err := <-decided:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second): // the turn ended without asking: fail, not hang
		t.Fatalf("no decision was sent (no permission_required?): %v", col.kinds())
	}
	if col.err != nil {
		t.Fatalf("turn failed: %v", col.err)
	}
	asked, last := 0, col.events[len(col.events)-1]
	var askedSeq uint64
	for i, ev := range col.events {
		if ev.GetSeq() != uint64(i+1) {
			t.Fatalf("seqs %v", col.kinds())
		}
		if ev.GetPermissionRequired() != nil {
			asked++
			askedSeq = ev.GetSeq()
		}
	}
	if asked != 1 || last.GetRunCompleted() == nil || len(col.finals()) != 1 {
		t.Fatalf("events %v", col.kinds())
	}
	if len(col.retries) == 0 || col.retries[0].op != string(client.OpStreamRun) || col.retries[0].afterSeq != askedSeq {
		t.Fatalf("retries %+v (permission_required at seq %d)", col.retries, askedSeq)
	}
}
