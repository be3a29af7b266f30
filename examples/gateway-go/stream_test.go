package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	roundtablev1 "github.com/roundtable/roundtable/clients/go/roundtable/v1"
)

// A reply whose text starts over (its model call retried after it had streamed) shows the
// new text on a line of its own, not appended to the dropped chunks.
func TestDeltasOfANewAttemptStartOver(t *testing.T) {
	ev := func(seq uint64, e *roundtablev1.RunEvent) *roundtablev1.RunEvent { e.Seq = seq; return e }
	delta := func(attempt uint32, text string) *roundtablev1.RunEvent {
		return &roundtablev1.RunEvent{Payload: &roundtablev1.RunEvent_AssistantDelta{AssistantDelta: &roundtablev1.AssistantDelta{
			ReplyId: "r1#0", Text: text, Attempt: attempt}}}
	}
	f := &fakeSidecar{events: []*roundtablev1.RunEvent{
		ev(1, &roundtablev1.RunEvent{Payload: &roundtablev1.RunEvent_RunStarted{RunStarted: &roundtablev1.RunStarted{}}}),
		ev(2, &roundtablev1.RunEvent{Payload: &roundtablev1.RunEvent_SpeakerStarted{SpeakerStarted: &roundtablev1.SpeakerStarted{
			MemberId: "mei", ReplyId: "r1#0", Attempt: 1}}}),
		delta(1, "Hel"),
		delta(2, "Hi "),
		delta(2, "there"),
		ev(3, &roundtablev1.RunEvent{Payload: &roundtablev1.RunEvent_AssistantFinal{AssistantFinal: &roundtablev1.AssistantFinal{
			ReplyId: "r1#0", MemberId: "mei", Content: "Hi there!"}}}),
		ev(4, &roundtablev1.RunEvent{Payload: &roundtablev1.RunEvent_RunCompleted{RunCompleted: &roundtablev1.RunCompleted{
			Replies: []*roundtablev1.ReplySummary{{ReplyId: "r1#0", MemberId: "mei"}}}}}),
	}}
	store, err := OpenStore(filepath.Join(t.TempDir(), "gw.json"))
	if err != nil {
		t.Fatal(err)
	}
	store.AddRun(StoredRun{Tenant: "demo", RunID: "r1", ThreadID: "th"}, "@Mei hi")
	req := &roundtablev1.StartRunRequest{
		Context:  &roundtablev1.RunContext{RunId: "r1", ThreadId: "th", Tenant: "demo"},
		Snapshot: &roundtablev1.Snapshot{Members: []*roundtablev1.Member{{MemberId: "mei", DisplayName: "Mei"}}},
	}
	out := &bytes.Buffer{}
	turn := &Turn{Client: f, Request: req, Store: store, Out: out, MaxFailures: 1,
		Memory: &MemoryRules{Store: store, Tenant: "demo", RunID: "r1"}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := turn.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "Mei: Hel\n   (again) Hi there!\n") {
		t.Fatalf("output:\n%s", out.String())
	}
}
