package main

// approval.go: members call tools, and a person approves the risky calls.
//
// A tool whose approval policy is ALWAYS announces each call with permission_required;
// the run then waits in the sidecar (RUN_STATUS_AWAITING_APPROVAL) with the stream open
// and idle. The gateway decides each request on a goroutine of its own, so the event loop
// keeps reading (the other speakers of a parallel group go on meanwhile), and sends the
// decision with ResolvePermission; the same stream then carries the rest of the turn.
//
// -approve=ask asks the person at the terminal (y or n, and an optional reason for n);
// always and never decide at once, for scripts. A request that is no longer pending (the
// log of a run retried with -run-id replays it, another gateway or an expiry decided it)
// is only shown. Errors are told apart by their ErrorInfo reason, not their code:
// PERMISSION_DECIDED (something was decided first), PERMISSION_NOT_FOUND.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/roundtable/roundtable/clients/go/client"
	roundtablev1 "github.com/roundtable/roundtable/clients/go/roundtable/v1"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// The -approve modes.
const (
	ApproveAsk    = "ask"    // ask the person at the terminal
	ApproveAlways = "always" // approve every call (scripts)
	ApproveNever  = "never"  // deny every call (scripts)
)

// maxReasonRunes is the longest denial reason ResolvePermission accepts.
const maxReasonRunes = 1024

// PermissionResult is one permission request of the run and what this gateway did about it.
type PermissionResult struct {
	PermissionRequestID string `json:"permission_request_id"`
	ReplyID             string `json:"reply_id"`
	MemberID            string `json:"member_id"`
	ToolName            string `json:"tool_name"`
	ArgumentsJSON       string `json:"arguments_json"`
	// Decision is what this gateway sent: approve, deny, or "" when it sent none.
	Decision  string `json:"decision"`
	Reason    string `json:"reason,omitempty"`
	DecidedBy string `json:"decided_by,omitempty"` // terminal, -approve=always or -approve=never
	// Result: recorded (Roundtable recorded this gateway's decision), already_decided (it
	// was decided without this gateway: the log of a retried run replays it, another
	// gateway or a cancel decided first; Note says what), expired (nobody answered before
	// expires_at), unanswered (stdin closed, or the turn ended first), not_found
	// (PERMISSION_NOT_FOUND) or failed.
	Result string `json:"result"`
	Note   string `json:"note,omitempty"`
}

var (
	errStdinClosed = errors.New("stdin closed")
	errExpired     = errors.New("the request expired")
	errTurnOver    = errors.New("the turn ended")
)

// Prompter reads the person's answers at the terminal, one question at a time, in the
// order the requests came.
type Prompter struct {
	In   io.Reader
	Echo bool // print each answer read (stdin is not a terminal, so nothing else shows it)

	queue sync.Mutex
	last  chan struct{} // closed when the question queued last is done
	once  sync.Once
	lines chan string
}

// enqueue takes the next place in the queue of questions: turn is closed when the
// questions before it are done; done ends this one (call it exactly once).
func (p *Prompter) enqueue() (turn <-chan struct{}, done func()) {
	p.queue.Lock()
	defer p.queue.Unlock()
	before := p.last
	if before == nil {
		before = make(chan struct{})
		close(before)
	}
	mine := make(chan struct{})
	p.last = mine
	return before, func() { close(mine) }
}

// line returns the next line typed, errStdinClosed at the end of the input, or the
// context's cause.
func (p *Prompter) line(ctx context.Context) (string, error) {
	p.once.Do(func() {
		p.lines = make(chan string)
		go func() {
			scanner := bufio.NewScanner(p.In)
			for scanner.Scan() {
				p.lines <- scanner.Text()
			}
			close(p.lines)
		}()
	})
	select {
	case line, ok := <-p.lines:
		if !ok {
			return "", errStdinClosed
		}
		return line, nil
	case <-ctx.Done():
		return "", context.Cause(ctx)
	}
}

// requestPermission handles a permission_required event; the event loop holds t.mu.
func (t *Turn) requestPermission(ctx context.Context, p *roundtablev1.PermissionRequired) {
	id := p.GetPermissionRequestId()
	res := t.permissions[id]
	if res == nil {
		res = &PermissionResult{
			PermissionRequestID: id, ReplyID: p.GetReplyId(), MemberID: p.GetMemberId(),
			ToolName: toolName(p), ArgumentsJSON: p.GetArgumentsJson(),
		}
		t.permissions[id] = res
		t.permissionOrder = append(t.permissionOrder, id)
	}
	if t.open == p.GetReplyId() && t.openText == "" {
		fmt.Fprint(t.Out, "(asks to use a tool)")
	}
	t.endLine()
	expires := ""
	if p.GetExpiresAt() != nil {
		expires = ", expires " + p.GetExpiresAt().AsTime().Local().Format("2006-01-02 15:04:05")
	}
	fmt.Fprintf(t.Out, "── %s wants to run %s %s (request %s%s)\n", t.name(p.GetMemberId()), res.ToolName,
		res.ArgumentsJSON, id, expires)
	if _, deciding := t.waiting[id]; deciding {
		return
	}
	reqCtx, stop := context.WithCancelCause(ctx)
	t.waiting[id] = stop
	var turn <-chan struct{}
	var done func()
	if t.Approve == ApproveAsk {
		turn, done = t.Prompt.enqueue() // asked in the order the requests came
	}
	t.deciding.Add(1)
	go t.decide(reqCtx, ctx, p, res, turn, done)
}

// settle stops asking about the requests of a reply that went on without this gateway's
// decision (every request when replyID is ""); the event loop holds t.mu.
func (t *Turn) settle(replyID string, why error) {
	for id, stop := range t.waiting {
		if replyID == "" || t.permissions[id].ReplyID == replyID {
			stop(why)
		}
	}
}

// stopDeciding ends every decision still being made and waits for them.
func (t *Turn) stopDeciding() {
	t.mu.Lock()
	t.settle("", errTurnOver)
	t.mu.Unlock()
	t.deciding.Wait()
}

// decide makes and sends the decision on one request. ctx ends when the request is settled
// without it, expires, or the turn ends; turnCtx is the turn's. With -approve=ask, turn is
// closed when it is this request's turn to be asked, and done ends its turn.
func (t *Turn) decide(ctx, turnCtx context.Context, p *roundtablev1.PermissionRequired, res *PermissionResult,
	turn <-chan struct{}, done func()) {
	defer t.deciding.Done()
	id := p.GetPermissionRequestId()
	defer func() {
		t.mu.Lock()
		if stop := t.waiting[id]; stop != nil {
			stop(nil)
			delete(t.waiting, id)
		}
		t.mu.Unlock()
	}()
	if exp := p.GetExpiresAt(); exp != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadlineCause(ctx, exp.AsTime(), errExpired)
		defer cancel()
	}
	lib := client.Wrap(t.Client)
	rc := t.Request.GetContext()
	if done != nil {
		// One question at a time, each answered and sent before the next is asked.
		select {
		case <-turn:
			defer done()
		case <-ctx.Done():
			go func() { <-turn; done() }() // the next question still waits for the one before
			t.interrupted(ctx, turnCtx, res, false)
			return
		}
	}

	// Only a request still pending is decided: a retried run's log replays its requests
	// (and the reply that followed them, which may settle ctx before GetRun answers).
	run, err := lib.GetRun(ctx, rc.GetRunId(), rc.GetTenant())
	if ctx.Err() != nil {
		t.interrupted(ctx, turnCtx, res, false)
		return
	}
	if err == nil && !pending(run, id) {
		note := "decided before"
		t.mu.Lock()
		if d := t.Store.Decision(rc.GetTenant(), rc.GetRunId(), id); d != nil {
			note = fmt.Sprintf("decided before by %s: %s", d.DecidedBy, d.Decision)
		}
		t.mu.Unlock()
		t.report(ctx, res, "already_decided", note, "   = %s: %s\n", id, note)
		return
	}

	decision, reason, by, err := t.choose(ctx, p)
	if errors.Is(err, errStdinClosed) {
		t.report(ctx, res, "unanswered", "stdin closed", "   ? no answer (stdin closed)\n")
		t.abort(fmt.Errorf("no answer to permission request %s (stdin closed); the run waits for a decision: "+
			"run again with -run-id %s (-approve=always or -approve=never for scripts)", id, rc.GetRunId()))
		return
	}
	if err != nil {
		t.interrupted(ctx, turnCtx, res, t.Approve == ApproveAsk)
		return
	}
	// The event loop waits while the decision is sent, so its outcome is printed before
	// what the run does next.
	t.mu.Lock()
	defer t.mu.Unlock()
	res.Decision, res.Reason, res.DecidedBy = enumName(decision.String(), "PERMISSION_DECISION_"), reason, by
	_, err = t.resolve(turnCtx, id, decision, reason)
	var e *client.Error
	switch {
	case err == nil:
		t.Store.PutDecision(StoredDecision{
			Tenant: rc.GetTenant(), RunID: rc.GetRunId(), PermissionRequestID: id, MemberID: res.MemberID,
			ToolName: res.ToolName, ArgumentsJSON: res.ArgumentsJSON, Decision: res.Decision, Reason: reason,
			DecidedBy: by, DecidedAt: time.Now().UTC(),
		})
		if err := t.Store.Save(); err != nil {
			t.abort(fmt.Errorf("storing the decision on %s: %w", id, err))
		}
		call := fmt.Sprintf("%s's %s", t.name(res.MemberID), res.ToolName)
		if decision == roundtablev1.PermissionDecision_PERMISSION_DECISION_APPROVE {
			t.reportLocked(ctx, res, "recorded", "", "   ✓ %s approved (%s)\n", call, by)
		} else if reason != "" {
			t.reportLocked(ctx, res, "recorded", "", "   ✗ %s denied (%s): %s\n", call, by, reason)
		} else {
			t.reportLocked(ctx, res, "recorded", "", "   ✗ %s denied (%s)\n", call, by)
		}
	case errors.As(err, &e) && e.Reason == client.ReasonPermissionDecided:
		// Someone else decided first, it expired, or the run was cancelled: the message
		// names what is recorded, and the run goes on by that.
		t.reportLocked(ctx, res, "already_decided", e.Message, "   = too late, already decided: %s\n", e.Message)
	case errors.As(err, &e) && e.Reason == client.ReasonPermissionNotFound:
		t.reportLocked(ctx, res, "not_found", e.Message, "   ✗ Roundtable knows no such request: %s\n", e.Message)
	case turnCtx.Err() != nil:
		t.reportLocked(ctx, res, "unanswered", "the turn ended first", "")
	default:
		t.reportLocked(ctx, res, "failed", err.Error(), "   ✗ ResolvePermission failed: %v\n", err)
		t.abort(fmt.Errorf("could not send the decision on %s: %w; the run waits for one: run again with -run-id %s",
			id, err, rc.GetRunId()))
	}
}

// interrupted records a request this gateway stopped deciding: it expired, it was settled
// without this gateway (the reply went on: a replay, another gateway, a cancel), or the
// turn ended. asked: the person was being asked, so they are told.
func (t *Turn) interrupted(ctx, turnCtx context.Context, res *PermissionResult, asked bool) {
	cause := context.Cause(ctx)
	switch {
	case errors.Is(cause, errExpired):
		t.report(ctx, res, "expired", "nobody answered in time", "   ? %s expired before an answer\n", res.PermissionRequestID)
	case turnCtx.Err() != nil || errors.Is(cause, errTurnOver):
		t.report(ctx, res, "unanswered", "the turn ended first", "")
	case asked:
		t.report(ctx, res, "already_decided", cause.Error(), "   = %s: %v; not asking any more\n", res.PermissionRequestID, cause)
	default:
		t.report(ctx, res, "already_decided", cause.Error(), "")
	}
}

// choose decides by -approve, or asks the person.
func (t *Turn) choose(ctx context.Context, p *roundtablev1.PermissionRequired) (roundtablev1.PermissionDecision, string, string, error) {
	if ctx.Err() != nil {
		return roundtablev1.PermissionDecision_PERMISSION_DECISION_UNSPECIFIED, "", "", context.Cause(ctx)
	}
	switch t.Approve {
	case ApproveAlways:
		return roundtablev1.PermissionDecision_PERMISSION_DECISION_APPROVE, "", "-approve=always", nil
	case ApproveNever:
		return roundtablev1.PermissionDecision_PERMISSION_DECISION_DENY, "the gateway allows no such call (-approve=never)",
			"-approve=never", nil
	}
	decision, reason, err := t.ask(ctx, p)
	return decision, reason, "terminal", err
}

// ask puts the question to the person at the terminal: y or n, then an optional reason
// for n. The turn's -timeout does not run meanwhile.
func (t *Turn) ask(ctx context.Context, p *roundtablev1.PermissionRequired) (roundtablev1.PermissionDecision, string, error) {
	none := roundtablev1.PermissionDecision_PERMISSION_DECISION_UNSPECIFIED
	if ctx.Err() != nil {
		return none, "", context.Cause(ctx)
	}
	t.Clock.Pause()
	defer t.Clock.Resume()
	read := func(question string) (string, error) {
		t.mu.Lock()
		t.endLine()
		fmt.Fprint(t.Out, question)
		t.question = question // shown again below whatever the event loop prints meanwhile
		t.mu.Unlock()
		line, err := t.Prompt.line(ctx)
		t.mu.Lock()
		t.question, t.questionCut = "", false
		if err == nil && t.Prompt.Echo {
			fmt.Fprintln(t.Out, line)
		} else if err != nil {
			fmt.Fprintln(t.Out)
		}
		t.mu.Unlock()
		return strings.TrimSpace(line), err
	}
	question := fmt.Sprintf("   allow %s to run %s %s? [y/n] ", t.nameOf(p.GetMemberId()), toolName(p), p.GetArgumentsJson())
	for {
		answer, err := read(question)
		if err != nil {
			return none, "", err
		}
		switch strings.ToLower(answer) {
		case "y", "yes":
			return roundtablev1.PermissionDecision_PERMISSION_DECISION_APPROVE, "", nil
		case "n", "no":
			reason, err := read("   why not? (optional, told to the member) ")
			if err != nil && !errors.Is(err, errStdinClosed) {
				return none, "", err
			}
			return roundtablev1.PermissionDecision_PERMISSION_DECISION_DENY, truncateRunes(reason, maxReasonRunes), nil
		}
		question = "   please answer y or n: "
	}
}

// resolve sends the decision; a retryable failure (the sidecar unreachable, draining) is
// sent again, which is safe: the same decision again answers the same.
func (t *Turn) resolve(ctx context.Context, id string, decision roundtablev1.PermissionDecision, reason string) (*roundtablev1.ResolvePermissionResponse, error) {
	lib := client.Wrap(t.Client)
	rc := t.Request.GetContext()
	delay := 200 * time.Millisecond
	for attempt := 1; ; attempt++ {
		resp, err := lib.ResolvePermission(ctx, rc.GetRunId(), rc.GetTenant(), id, decision, reason, "")
		var e *client.Error
		if err == nil || !errors.As(err, &e) || !e.Retryable || attempt == 5 {
			return resp, err
		}
		wait := delay
		if e.HasRetryDelay {
			wait = e.RetryDelay
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, err
		}
		delay *= 2
	}
}

// report records what became of a request, prints a line (unless format is empty) and
// adds a span event.
func (t *Turn) report(ctx context.Context, res *PermissionResult, result, note, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reportLocked(ctx, res, result, note, format, args...)
}

// reportLocked is report with t.mu held.
func (t *Turn) reportLocked(ctx context.Context, res *PermissionResult, result, note, format string, args ...any) {
	res.Result, res.Note = result, note
	if format != "" {
		t.endLine()
		fmt.Fprintf(t.Out, format, args...)
	}
	trace.SpanFromContext(ctx).AddEvent("permission", trace.WithAttributes(
		attribute.String("roundtable.permission_request_id", res.PermissionRequestID),
		attribute.String("roundtable.tool_name", res.ToolName),
		attribute.String("decision", res.Decision),
		attribute.String("result", result),
	))
}

// printf prints from a decider, between the event loop's prints.
func (t *Turn) nameOf(memberID string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.name(memberID)
}

// Permissions returns the run's permission requests, in the order they came.
func (t *Turn) Permissions() []PermissionResult {
	out := make([]PermissionResult, 0, len(t.permissionOrder))
	for _, id := range t.permissionOrder {
		out = append(out, *t.permissions[id])
	}
	return out
}

func pending(run *roundtablev1.Run, id string) bool {
	for _, p := range run.GetPendingPermissions() {
		if p.GetPermissionRequestId() == id {
			return true
		}
	}
	return false
}

// toolName is the tool a request names (tool_name; action is the same).
func toolName(p *roundtablev1.PermissionRequired) string {
	if p.GetToolName() != "" {
		return p.GetToolName()
	}
	return p.GetAction()
}

func truncateRunes(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n])
}

// TurnClock is a turn's -timeout: it cancels the turn's context once the turn has taken
// that long, not counting the time a person takes to answer a permission prompt.
type TurnClock struct {
	mu     sync.Mutex
	left   time.Duration
	since  time.Time
	timer  *time.Timer
	paused int
	fire   func()
}

// WithTurnClock returns a context cancelled (with a cause wrapping
// context.DeadlineExceeded) after d of unpaused time, and its clock.
func WithTurnClock(parent context.Context, d time.Duration) (context.Context, *TurnClock, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	cause := fmt.Errorf("the turn took longer than -timeout %s: %w", d, context.DeadlineExceeded)
	c := &TurnClock{left: d, since: time.Now(), fire: func() { cancel(cause) }}
	c.timer = time.AfterFunc(d, c.fire)
	return ctx, c, func() {
		c.mu.Lock()
		c.timer.Stop()
		c.mu.Unlock()
		cancel(context.Canceled)
	}
}

// Pause stops the clock until the matching Resume. A nil clock does nothing.
func (c *TurnClock) Pause() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.paused++; c.paused == 1 && c.timer.Stop() {
		c.left -= time.Since(c.since)
	}
}

// Resume starts the clock again once every Pause is matched.
func (c *TurnClock) Resume() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.paused--; c.paused == 0 {
		c.since = time.Now()
		c.timer = time.AfterFunc(max(c.left, 0), c.fire)
	}
}
