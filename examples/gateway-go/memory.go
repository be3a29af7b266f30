package main

// memory.go: Roundtable proposes memories, the gateway disposes. Every proposal is
// checked against the gateway's own rules and data, then stored or rejected with a
// reason. Nothing here trusts the proposal: the member must exist, the text must be
// worth keeping and must not be a memory the member already has.

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strings"

	roundtablev1 "github.com/roundtable/roundtable/clients/go/roundtable/v1"
)

// MinImportance is the least importance a memory must have to be kept.
const MinImportance = 0.3

// MemoryDecision is what the gateway did with one proposal.
type MemoryDecision struct {
	ProposalID string  `json:"proposal_id"`
	MemberID   string  `json:"member_id"`
	Action     string  `json:"action"`
	Content    string  `json:"content"`
	Importance float32 `json:"importance"`
	MemoryID   string  `json:"memory_id,omitempty"` // the memory stored, updated or forgotten
	Reason     string  `json:"reason,omitempty"`    // why it was rejected
	Accepted   bool    `json:"-"`
}

// MemoryRules decides the proposals of one run.
type MemoryRules struct {
	Store   *Store
	Tenant  string
	RunID   string
	Members map[string]*roundtablev1.Member // the roster the run was given

	forgotten map[string]bool
}

// Decide validates one proposal and, when it passes, applies it to the store (the
// caller saves the store). Accepted proposals are applied at once, so a later proposal
// of the same batch that repeats one is a duplicate.
func (r *MemoryRules) Decide(p *roundtablev1.MemoryProposal) MemoryDecision {
	d := MemoryDecision{
		ProposalID: p.GetProposalId(),
		MemberID:   p.GetMemberId(),
		Action:     strings.ToLower(strings.TrimPrefix(p.GetAction().String(), "MEMORY_ACTION_")),
		Content:    strings.TrimSpace(p.GetContent()),
		Importance: p.GetImportance(),
	}
	if reason := r.check(p, &d); reason != "" {
		d.Reason = reason
		return d
	}
	d.Accepted = true
	switch p.GetAction() {
	case roundtablev1.MemoryAction_MEMORY_ACTION_CREATE:
		d.MemoryID = memoryID(r.Tenant, d.ProposalID)
		r.put(d)
	case roundtablev1.MemoryAction_MEMORY_ACTION_UPDATE:
		d.MemoryID = p.GetTargetMemoryId()
		r.put(d)
	case roundtablev1.MemoryAction_MEMORY_ACTION_FORGET:
		d.MemoryID = p.GetTargetMemoryId()
		r.Store.DeleteMemory(r.Tenant, d.MemoryID)
		if r.forgotten == nil {
			r.forgotten = map[string]bool{}
		}
		r.forgotten[d.MemoryID] = true
	}
	return d
}

// check returns why a proposal is rejected, or "".
func (r *MemoryRules) check(p *roundtablev1.MemoryProposal, d *MemoryDecision) string {
	if _, ok := r.Members[d.MemberID]; !ok {
		return fmt.Sprintf("unknown member %q", d.MemberID)
	}
	existing := r.existing(d.MemberID)
	action := p.GetAction()
	switch action {
	case roundtablev1.MemoryAction_MEMORY_ACTION_CREATE:
	case roundtablev1.MemoryAction_MEMORY_ACTION_UPDATE, roundtablev1.MemoryAction_MEMORY_ACTION_FORGET:
		if !existing.has(p.GetTargetMemoryId()) {
			return fmt.Sprintf("%s names no memory of %s: %q", d.Action, d.MemberID, p.GetTargetMemoryId())
		}
		if action == roundtablev1.MemoryAction_MEMORY_ACTION_FORGET {
			return ""
		}
	default:
		return fmt.Sprintf("unknown action %v", action)
	}
	if d.Content == "" {
		return "empty content"
	}
	imp := float64(d.Importance)
	if math.IsNaN(imp) || imp < 0 || imp > 1 {
		return fmt.Sprintf("importance %v outside [0, 1]", d.Importance)
	}
	if imp < MinImportance {
		return fmt.Sprintf("importance %.2f below %.1f", d.Importance, MinImportance)
	}
	want := normalize(d.Content)
	for _, m := range existing {
		if m.id != p.GetTargetMemoryId() && normalize(m.content) == want {
			return fmt.Sprintf("duplicate of memory %s", m.id)
		}
	}
	return ""
}

type memoryText struct{ id, content string }

type memoryList []memoryText

func (l memoryList) has(id string) bool {
	for _, m := range l {
		if m.id == id {
			return true
		}
	}
	return false
}

// existing is what a member remembers now: the memories the snapshot gave it and the
// ones the gateway stored (accepted proposals included).
// The store is the newer truth: an updated memory shadows the snapshot's copy, and a
// forgotten one is gone.
func (r *MemoryRules) existing(memberID string) memoryList {
	var out memoryList
	for _, m := range r.Store.Memories(r.Tenant, memberID) {
		out = append(out, memoryText{m.MemoryID, m.Content})
	}
	for _, m := range r.Members[memberID].GetMemories() {
		if !out.has(m.GetMemoryId()) && !r.forgotten[m.GetMemoryId()] {
			out = append(out, memoryText{m.GetMemoryId(), m.GetContent()})
		}
	}
	return out
}

func (r *MemoryRules) put(d MemoryDecision) {
	r.Store.PutMemory(StoredMemory{
		Tenant: r.Tenant, MemoryID: d.MemoryID, MemberID: d.MemberID, Content: d.Content,
		Importance: d.Importance, ProposalID: d.ProposalID, RunID: r.RunID,
	})
}

// memoryID derives the id of the memory a CREATE proposal makes, so the same proposal
// always names the same memory.
func memoryID(tenant, proposalID string) string {
	sum := sha256.Sum256([]byte(tenant + "\x00" + proposalID))
	return "mem-" + hex.EncodeToString(sum[:8])
}

// rememberPrefixes are how users ask to remember something; they are not part of what
// is remembered ("remember that I prefer tea" is the memory "I prefer tea").
var rememberPrefixes = []string{
	"please remember that ", "please remember ", "remember that ", "remember: ",
	"请记住：", "请记住:", "请记住，", "请记住", "记住：", "记住:", "记住，", "记住",
}

// normalize is how memory contents are compared: case, spacing, a "remember that"
// and trailing punctuation do not make a memory new.
func normalize(s string) string {
	s = strings.ToLower(strings.Join(strings.Fields(s), " "))
	for _, p := range rememberPrefixes {
		if rest, ok := strings.CutPrefix(s, p); ok {
			s = rest
			break
		}
	}
	return strings.TrimRight(s, ".!?。！？ ")
}
