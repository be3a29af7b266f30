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
	for _, k := range []int{1, 3, -2} { // -2: right after the 2nd assistant_final
		name := fmt.Sprintf("after_%d_messages", k)
		if k < 0 {
			name = "after_2nd_final"
		}
		t.Run(name, func(t *testing.T) {
			proxy := startProxy(t, server.address(), max(k, 0))
			c := connect(t, proxy.address(), client.DialOptions{})
			runID := "c2-" + name
			finals := 0
			col := turnOf(ctxFor(t, time.Minute), t, c, demoRequest(runID, "t-"+runID, "@all tell me about your day"), nil,
				func(ev *roundtablev1.RunEvent, _ *collected) {
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
