package main

import (
	"path/filepath"
	"strings"
	"testing"

	roundtablev1 "github.com/roundtable/roundtable/clients/go/roundtable/v1"
)

func rules(t *testing.T) *MemoryRules {
	t.Helper()
	store, err := OpenStore(filepath.Join(t.TempDir(), "db.json"))
	if err != nil {
		t.Fatal(err)
	}
	members := map[string]*roundtablev1.Member{}
	for _, m := range demoSnapshot().GetMembers() {
		members[m.GetMemberId()] = m
	}
	members["kai"].Memories = []*roundtablev1.Memory{{MemoryId: "k1", Content: "Likes rain.", Importance: 0.5}}
	return &MemoryRules{Store: store, Tenant: "t", RunID: "r", Members: members}
}

func create(id, member, content string, importance float32) *roundtablev1.MemoryProposal {
	return &roundtablev1.MemoryProposal{
		ProposalId: id, MemberId: member, Action: roundtablev1.MemoryAction_MEMORY_ACTION_CREATE,
		Content: content, Importance: importance, EvidenceReplyIds: []string{"user"},
	}
}

func TestMemoryRules(t *testing.T) {
	r := rules(t)
	cases := []struct {
		proposal *roundtablev1.MemoryProposal
		reason   string // "" means accepted
	}{
		{create("p0", "mei", "I prefer green tea", 0.7), ""},
		{create("p1", "mei", "remember that I prefer green tea.", 0.9), "duplicate of memory mem-"},
		{create("p1b", "lin", "我更喜欢绿茶", 0.7), ""},
		{create("p1c", "lin", "请记住我更喜欢绿茶。", 0.9), "duplicate of memory mem-"},
		{create("p2", "lin", "I prefer green tea", 0.7), ""}, // another member may know it too
		{create("p3", "kai", "likes  RAIN", 0.5), "duplicate of memory k1"},
		{create("p4", "zed", "I prefer green tea", 0.7), "unknown member"},
		{create("p5", "bo", "   ", 0.7), "empty content"},
		{create("p6", "bo", "Wants numbers", 0.29), "below 0.3"},
		{create("p7", "bo", "Wants numbers", 1.5), "outside [0, 1]"},
		{create("p8", "bo", "Wants numbers", -0.1), "outside [0, 1]"},
		{create("p9", "bo", "Wants numbers", 0.3), ""},
		{&roundtablev1.MemoryProposal{ProposalId: "p10", MemberId: "kai", Action: roundtablev1.MemoryAction_MEMORY_ACTION_UPDATE,
			TargetMemoryId: "nope", Content: "x", Importance: 0.5}, "names no memory"},
		{&roundtablev1.MemoryProposal{ProposalId: "p11", MemberId: "kai", Action: roundtablev1.MemoryAction_MEMORY_ACTION_UPDATE,
			TargetMemoryId: "k1", Content: "Likes rain a lot", Importance: 0.6}, ""},
		{&roundtablev1.MemoryProposal{ProposalId: "p12", MemberId: "bo", Action: roundtablev1.MemoryAction_MEMORY_ACTION_UNSPECIFIED,
			Content: "x", Importance: 0.5}, "unknown action"},
	}
	for _, c := range cases {
		d := r.Decide(c.proposal)
		if c.reason == "" && !d.Accepted {
			t.Errorf("%s: rejected (%s), want accepted", c.proposal.GetProposalId(), d.Reason)
		}
		if c.reason != "" && (d.Accepted || !strings.Contains(d.Reason, c.reason)) {
			t.Errorf("%s: accepted=%t reason %q, want rejected with %q", c.proposal.GetProposalId(), d.Accepted, d.Reason, c.reason)
		}
	}
	if got := len(r.Store.Memories("t", "mei")); got != 1 {
		t.Errorf("mei has %d memories, want 1", got)
	}
	kai := r.Store.Memories("t", "kai")
	if len(kai) != 1 || kai[0].MemoryID != "k1" || kai[0].Content != "Likes rain a lot" {
		t.Errorf("kai's update: %+v", kai)
	}
	forget := &roundtablev1.MemoryProposal{ProposalId: "p13", MemberId: "kai", Action: roundtablev1.MemoryAction_MEMORY_ACTION_FORGET, TargetMemoryId: "k1"}
	if d := r.Decide(forget); !d.Accepted || len(r.Store.Memories("t", "kai")) != 0 {
		t.Errorf("forget: %+v, left %v", d, r.Store.Memories("t", "kai"))
	}
	if d := r.Decide(create("p14", "kai", "Likes rain a lot", 0.5)); !d.Accepted {
		t.Errorf("after forget, the same text is new again: %s", d.Reason)
	}
	if d := r.Decide(create("p15", "kai", "Likes rain.", 0.5)); !d.Accepted {
		t.Errorf("the snapshot's copy of a forgotten memory is gone: %s", d.Reason)
	}
}

func TestMemoryIDIsStable(t *testing.T) {
	if memoryID("t", "run:memory:0") != memoryID("t", "run:memory:0") || memoryID("t", "a") == memoryID("u", "a") {
		t.Fatal("memory ids must be derived from tenant and proposal id")
	}
}

func TestStoreKeepsAReplyOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db.json")
	s, _ := OpenStore(path)
	reply := Message{Tenant: "t", ThreadID: "th", RunID: "r", ReplyID: "r#0", MemberID: "lin", Content: "1!"}
	if !s.PutReply(reply) || s.PutReply(reply) {
		t.Fatal("the first PutReply stores, the second does not")
	}
	if err := s.Save(); err != nil {
		t.Fatal(err)
	}
	again, err := OpenStore(path)
	if err != nil {
		t.Fatal(err)
	}
	if again.PutReply(reply) || len(again.History("t", "th", 10)) != 1 {
		t.Fatal("a second process sees the stored reply")
	}
}
