// Command gateway-go is an example gateway for the Roundtable sidecar: it owns the
// data (a JSON file standing in for its database), sends Roundtable one user turn as
// an immutable snapshot, prints the conversation as it streams, persists the replies
// once each, validates the memory proposals by its own rules, re-attaches when the
// stream drops, and asks a person before a member's risky tool call runs. Its trace
// continues inside Roundtable.
//
//	go build -o gateway-go . && ./gateway-go -text "大家报数！"
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/roundtable/roundtable/clients/go/client"
	roundtablev1 "github.com/roundtable/roundtable/clients/go/roundtable/v1"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
)

type options struct {
	target, snapshot, text           string
	runID, threadID, tenant, request string
	db                               string
	dropAfter                        int
	maxFailures                      int
	parallel                         bool
	toolServer, approve              string
	timeout                          time.Duration
	security                         security
}

// Summary is the machine-readable last line of the output (`SUMMARY {...}`).
type Summary struct {
	RunID            string             `json:"run_id"`
	ThreadID         string             `json:"thread_id"`
	Tenant           string             `json:"tenant"`
	RequestID        string             `json:"request_id"`
	Status           string             `json:"status"` // completed, cancelled, failed or error
	Replies          []ReplyResult      `json:"replies"`
	AcceptedMemories []MemoryDecision   `json:"accepted_memories"`
	RejectedMemories []MemoryDecision   `json:"rejected_memories"`
	FailedSpeakers   []SpeakerFailure   `json:"failed_speakers"`
	Permissions      []PermissionResult `json:"permissions"` // the run's permission requests and what became of each
	MissingReplies   []string           `json:"missing_replies"`
	Resumed          bool               `json:"resumed"`
	Reattached       bool               `json:"reattached"`
	Reattaches       int                `json:"reattaches"`
	LastSeq          uint64             `json:"last_seq"`
	EventsSkipped    int                `json:"events_skipped"`   // durable events delivered again, ignored by seq
	DuplicateFinals  int                `json:"duplicate_finals"` // finals of replies already persisted
	RetriedRun       bool               `json:"retried_run"`      // the run_id was in the store: its stored snapshot was sent again
	TraceID          string             `json:"trace_id"`
	Error            string             `json:"error,omitempty"`
}

func main() {
	var o options
	flag.StringVar(&o.target, "target", "127.0.0.1:50051", "the sidecar's host:port")
	flag.StringVar(&o.snapshot, "snapshot", "", "a protojson roundtable.v1.Snapshot file instead of the demo roster")
	flag.StringVar(&o.text, "text", "", "what the user says (overrides the snapshot file's user_turn.text)")
	flag.StringVar(&o.runID, "run-id", "", "run id (default: a new one); a run id already in -db is retried with its stored snapshot")
	flag.StringVar(&o.threadID, "thread-id", "demo-thread", "thread (conversation) id")
	flag.StringVar(&o.tenant, "tenant", "demo", "tenant")
	flag.StringVar(&o.request, "request-id", "", "request id of this attempt (default: a new one)")
	flag.StringVar(&o.db, "db", "gateway-db.json", "the gateway's store, a JSON file")
	flag.BoolVar(&o.parallel, "parallel", false, "a group's independent speakers answer at once (SPEAKER_CONCURRENCY_PARALLEL)")
	flag.IntVar(&o.dropAfter, "drop-after", 0, "test hook: close the StartRun stream after N durable events, then re-attach")
	flag.IntVar(&o.maxFailures, "max-failures", 8, "calls in a row without progress (the sidecar down, restarting, refusing) before the turn gives up")
	flag.StringVar(&o.toolServer, "tool-server", "", "URL of an MCP server (streamable HTTP): members may call its weather (runs as called) and note (each call approved)")
	flag.StringVar(&o.approve, "approve", ApproveAsk, "how tool calls that need approval are decided: ask (the person at the terminal), always or never")
	flag.DurationVar(&o.timeout, "timeout", 2*time.Minute, "deadline for the whole turn, not counting the time spent answering approval prompts")
	flag.StringVar(&o.security.tokenFile, "token-file", "", "a file holding the bearer token (or set ROUNDTABLE_TOKEN)")
	flag.StringVar(&o.security.caFile, "tls-ca", "", "PEM roots to trust: connect with TLS")
	flag.StringVar(&o.security.certFile, "tls-cert", "", "PEM client certificate (mutual TLS)")
	flag.StringVar(&o.security.keyFile, "tls-key", "", "PEM key of the client certificate")
	flag.Parse()
	os.Exit(run(o))
}

func run(o options) int {
	if o.runID == "" {
		o.runID = "gw-" + randomHex(8)
	}
	if o.request == "" {
		o.request = "req-" + randomHex(8)
	}
	summary := Summary{
		RunID: o.runID, ThreadID: o.threadID, Tenant: o.tenant, RequestID: o.request, Status: "error",
		Replies: []ReplyResult{}, AcceptedMemories: []MemoryDecision{}, RejectedMemories: []MemoryDecision{},
		FailedSpeakers: []SpeakerFailure{}, MissingReplies: []string{}, Permissions: []PermissionResult{},
	}
	defer printSummary(&summary)
	switch o.approve {
	case ApproveAsk, ApproveAlways, ApproveNever:
	default:
		return fail(&summary, fmt.Errorf("-approve %q: want ask, always or never", o.approve))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	shutdown, exporting, err := setupTracing(ctx)
	if err != nil {
		return fail(&summary, fmt.Errorf("tracing: %w", err))
	}
	defer func() { // flush the spans, even when the turn failed
		flushCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdown(flushCtx); err != nil {
			fmt.Fprintf(os.Stderr, "tracing shutdown: %v\n", err)
		}
	}()
	if exporting {
		fmt.Fprintln(os.Stderr, "tracing: exporting spans with OTLP/gRPC")
	}

	store, err := OpenStore(o.db)
	if err != nil {
		return fail(&summary, err)
	}
	request, retried, err := prepare(o, store)
	if err != nil {
		return fail(&summary, err)
	}
	summary.RetriedRun, summary.ThreadID = retried, request.GetContext().GetThreadId()

	dial, err := o.security.dialOptions(o.target)
	if err != nil {
		return fail(&summary, err)
	}
	conn, err := grpc.NewClient(o.target, append(dial,
		grpc.WithStatsHandler(otelgrpc.NewClientHandler()), // a span per RPC, traceparent + baggage out
	)...)
	if err != nil {
		return fail(&summary, err)
	}
	defer conn.Close()

	// Correlation fields travel as baggage; the turn is one span, the RPCs its children.
	ctx, err = withBaggage(ctx, "tenant", o.tenant, "request_id", o.request, "thread_id", summary.ThreadID)
	if err != nil {
		return fail(&summary, err)
	}
	ctx, clock, cancel := WithTurnClock(ctx, o.timeout) // paused while a person answers a prompt
	defer cancel()
	ctx, span := otel.Tracer("github.com/roundtable/roundtable/examples/gateway-go").Start(ctx, "gateway.turn",
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(
			// The correlation attributes Roundtable's own spans carry.
			attribute.String("roundtable.run_id", o.runID),
			attribute.String("roundtable.thread_id", summary.ThreadID),
			attribute.String("roundtable.request_id", o.request),
			attribute.String("roundtable.tenant", o.tenant),
			attribute.String("gen_ai.conversation.id", summary.ThreadID),
		))
	defer span.End()
	summary.TraceID = span.SpanContext().TraceID().String()

	members := map[string]*roundtablev1.Member{}
	for _, m := range request.GetSnapshot().GetMembers() {
		members[m.GetMemberId()] = m
	}
	turn := &Turn{
		Client:      roundtablev1.NewOrchestratorServiceClient(conn),
		Request:     request,
		Store:       store,
		Memory:      &MemoryRules{Store: store, Tenant: o.tenant, RunID: o.runID, Members: members},
		Out:         os.Stdout,
		DropAfter:   o.dropAfter,
		MaxFailures: o.maxFailures,
		Approve:     o.approve,
		Prompt:      &Prompter{In: os.Stdin, Echo: !isTerminal(os.Stdin)},
		Clock:       clock,
	}
	fmt.Printf("you: %s\n", request.GetSnapshot().GetUserTurn().GetText())
	err = turn.Run(ctx)
	turn.endLine()

	summary.Replies = turn.Replies()
	summary.AcceptedMemories = append(summary.AcceptedMemories, turn.accepted...)
	summary.RejectedMemories = append(summary.RejectedMemories, turn.rejected...)
	summary.FailedSpeakers = append(summary.FailedSpeakers, turn.failed...)
	summary.Permissions = append(summary.Permissions, turn.Permissions()...)
	summary.MissingReplies = append(summary.MissingReplies, turn.missing...)
	summary.Resumed, summary.Reattached, summary.Reattaches = turn.resumed, turn.reattaches > 0, turn.reattaches
	summary.LastSeq, summary.EventsSkipped, summary.DuplicateFinals = turn.lastSeq, turn.skipped, turn.dupFinals
	span.SetAttributes(
		attribute.Int("roundtable.replies", len(summary.Replies)),
		attribute.Int("roundtable.reattaches", turn.reattaches),
		attribute.Int64("roundtable.last_seq", int64(turn.lastSeq)),
	)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(otelcodes.Error, err.Error())
		var refused *client.Error
		if turn.lastSeq == 0 && errors.As(err, &refused) && !refused.Retryable { // Roundtable refused the request itself
			store.UpdateRun(o.tenant, o.runID, "rejected", 0)
			_ = store.Save()
		}
		if turn.lastSeq > 0 && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			// Interrupted here (Ctrl-C, -timeout): the run goes on in the sidecar
			// (DISCONNECT_POLICY_CONTINUE); the same run id picks it up again.
			err = fmt.Errorf("%w; the run goes on in the sidecar: re-attach with -run-id %s", err, o.runID)
		}
		return fail(&summary, err)
	}
	summary.Status = turn.terminal
	if turn.resumable {
		// Not finished: the sidecar stopped it (shutdown) or it failed retryably, and the
		// resumes tried here did not get through. The same run id goes on with it.
		msg := fmt.Sprintf("%s (%s): the run can go on; retry with -run-id %s", turn.terminal, turn.terminalMsg, o.runID)
		span.SetStatus(otelcodes.Error, msg)
		summary.Error = msg
		fmt.Fprintln(os.Stderr, "error: "+msg)
		return 1
	}
	if turn.terminal == "failed" {
		span.SetStatus(otelcodes.Error, turn.terminalMsg)
		summary.Error = turn.terminalMsg
		return 1
	}
	return 0
}

// prepare builds the StartRunRequest. A run_id the store already knows is a retry of
// the same turn: it is sent with the snapshot and thread stored for it (Roundtable
// attaches, resumes or replays). A new one gets a fresh snapshot, stored before it is
// sent, so a crash of the gateway can be retried the same way.
func prepare(o options, store *Store) (*roundtablev1.StartRunRequest, bool, error) {
	snapshot := &roundtablev1.Snapshot{}
	threadID := o.threadID
	stored := store.Run(o.tenant, o.runID)
	if stored != nil {
		if err := protojson.Unmarshal(stored.Snapshot, snapshot); err != nil {
			return nil, false, fmt.Errorf("stored snapshot of %s: %w", o.runID, err)
		}
		if o.text != "" && o.text != snapshot.GetUserTurn().GetText() {
			fmt.Fprintf(os.Stderr, "note: run %s is retried with its stored snapshot; -text is ignored\n", o.runID)
		}
		if o.toolServer != "" && !declares(snapshot, o.toolServer) {
			fmt.Fprintf(os.Stderr, "note: run %s is retried with its stored snapshot; -tool-server is ignored\n", o.runID)
		}
		threadID = stored.ThreadID
	} else {
		var err error
		if snapshot, err = buildSnapshot(o.snapshot, o.text, store, o.tenant, threadID); err != nil {
			return nil, false, err
		}
		if o.parallel {
			snapshot.Session.SpeakerConcurrency = roundtablev1.SpeakerConcurrency_SPEAKER_CONCURRENCY_PARALLEL
		}
		if o.toolServer != "" {
			if err := addTools(snapshot, o.toolServer); err != nil {
				return nil, false, err
			}
		}
		if snapshot.GetUserTurn().GetText() == "" && len(snapshot.GetUserTurn().GetMentions()) == 0 &&
			!snapshot.GetUserTurn().GetMentionAll() {
			return nil, false, errors.New("nothing to say: pass -text (or a snapshot with a user_turn)")
		}
		raw, err := protojson.Marshal(snapshot)
		if err != nil {
			return nil, false, err
		}
		store.AddRun(StoredRun{
			Tenant: o.tenant, RunID: o.runID, ThreadID: threadID, Snapshot: raw, Status: "started",
		}, snapshot.GetUserTurn().GetText())
		if err := store.Save(); err != nil {
			return nil, false, err
		}
	}
	return &roundtablev1.StartRunRequest{
		Context: &roundtablev1.RunContext{
			RunId: o.runID, ThreadId: threadID, RequestId: o.request, Tenant: o.tenant,
		},
		Snapshot: snapshot,
		Options: &roundtablev1.RunOptions{
			// Keep the run going when the stream drops; StreamRun picks it up again.
			DisconnectPolicy: roundtablev1.DisconnectPolicy_DISCONNECT_POLICY_CONTINUE,
		},
	}, stored != nil, nil
}

func fail(s *Summary, err error) int {
	s.Error = err.Error()
	fmt.Fprintf(os.Stderr, "error: %v\n", err)
	// INVALID_ARGUMENT carries a google.rpc.BadRequest naming every bad field.
	var e *client.Error
	if errors.As(err, &e) {
		for _, v := range e.Violations {
			fmt.Fprintf(os.Stderr, "  %s: %s\n", v.Field, v.Description)
		}
	}
	return 1
}

func printSummary(s *Summary) {
	raw, err := json.Marshal(s)
	if err != nil {
		raw = []byte(fmt.Sprintf(`{"status":"error","error":%q}`, err.Error()))
	}
	fmt.Printf("SUMMARY %s\n", raw)
}

// declares says whether a snapshot names a tool server at url.
func declares(s *roundtablev1.Snapshot, url string) bool {
	for _, server := range s.GetSession().GetToolServers() {
		if server.GetUrl() == url {
			return true
		}
	}
	return false
}

// isTerminal says whether f is a terminal (a person typing) rather than a pipe or a file.
func isTerminal(f *os.File) bool {
	info, err := f.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
