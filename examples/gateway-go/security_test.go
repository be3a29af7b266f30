package main

import "testing"

func TestLoopbackTargets(t *testing.T) {
	for target, want := range map[string]bool{
		"127.0.0.1:50051":          true,
		"localhost:50051":          true,
		"[::1]:50051":              true,
		"dns:///127.0.0.1:50051":   true,
		"unix:///tmp/rt.sock":      true,
		"10.0.0.5:50051":           false,
		"sidecar.internal:50051":   false,
		"dns:///example.com:443":   false,
		"127.0.0.1.evil.com:50051": false,
	} {
		if got := loopback(target); got != want {
			t.Errorf("loopback(%q) = %v, want %v", target, got, want)
		}
	}
}

func TestHistoryLeavesOutTurnsTheSidecarNeverTook(t *testing.T) {
	s := &Store{}
	s.AddRun(StoredRun{Tenant: "t", RunID: "refused", ThreadID: "th"}, "hi (refused)")
	s.UpdateRun("t", "refused", "rejected", 0)
	s.AddRun(StoredRun{Tenant: "t", RunID: "lost", ThreadID: "th"}, "hi (never reached it)")
	s.AddRun(StoredRun{Tenant: "t", RunID: "done", ThreadID: "th"}, "hi")
	s.UpdateRun("t", "done", "completed", 5)
	s.PutReply(Message{Tenant: "t", ThreadID: "th", RunID: "done", ReplyID: "done#0", Content: "hello"})
	var got []string
	for _, m := range s.History("t", "th", 10) {
		got = append(got, m.Content)
	}
	if len(got) != 2 || got[0] != "hi" || got[1] != "hello" {
		t.Fatalf("history = %q", got)
	}
}
