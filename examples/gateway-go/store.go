package main

// store.go: the gateway's own data. Roundtable owns none of it; it only proposes.
//
// A real gateway keeps this in its database. Here it is one JSON file, rewritten
// atomically (temporary file, fsync, rename) after every change, so a second process
// can read what the first one persisted, and a crash leaves either the old or the new
// file, never half of one. One gateway process per file at a time.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// StoredRun is a turn the gateway started: what it sent, so a retry of the same run_id
// sends the very same snapshot (Roundtable answers ALREADY_EXISTS to a different one).
type StoredRun struct {
	Tenant    string          `json:"tenant"`
	RunID     string          `json:"run_id"`
	ThreadID  string          `json:"thread_id"`
	Snapshot  json.RawMessage `json:"snapshot"` // protojson of roundtable.v1.Snapshot
	Status    string          `json:"status"`   // started, completed, cancelled, failed
	LastSeq   uint64          `json:"last_seq"` // the last durable event the gateway handled
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// Message is one line of a thread: the user's turn or a member's final reply.
// Replies are unique on (tenant, run_id, reply_id).
type Message struct {
	Tenant       string     `json:"tenant"`
	ThreadID     string     `json:"thread_id"`
	RunID        string     `json:"run_id"`
	MessageID    string     `json:"message_id"`
	Role         string     `json:"role"` // user or assistant
	ReplyID      string     `json:"reply_id,omitempty"`
	MemberID     string     `json:"member_id,omitempty"`
	Step         uint32     `json:"step,omitempty"`
	Content      string     `json:"content"`
	Model        string     `json:"model,omitempty"`
	FinishReason string     `json:"finish_reason,omitempty"`
	ToolCalls    []ToolCall `json:"tool_calls,omitempty"` // AssistantFinal.tool_calls
	CreatedAt    time.Time  `json:"created_at"`
}

// ToolCall is one tool call of a reply and how it ended.
type ToolCall struct {
	CallID   string `json:"call_id"`
	ToolName string `json:"tool_name"`
	Outcome  string `json:"outcome"` // ok, denied, expired or failed
}

// StoredDecision is a decision this gateway sent on a permission request and Roundtable
// recorded: who allowed which call, with which arguments, and why not.
type StoredDecision struct {
	Tenant              string    `json:"tenant"`
	RunID               string    `json:"run_id"`
	PermissionRequestID string    `json:"permission_request_id"`
	MemberID            string    `json:"member_id"`
	ToolName            string    `json:"tool_name"`
	ArgumentsJSON       string    `json:"arguments_json"`
	Decision            string    `json:"decision"` // approve or deny
	Reason              string    `json:"reason,omitempty"`
	DecidedBy           string    `json:"decided_by"` // the terminal, or -approve=always / -approve=never
	DecidedAt           time.Time `json:"decided_at"`
}

// StoredMemory is a memory a member keeps, owned by the gateway.
type StoredMemory struct {
	Tenant     string    `json:"tenant"`
	MemoryID   string    `json:"memory_id"`
	MemberID   string    `json:"member_id"`
	Content    string    `json:"content"`
	Importance float32   `json:"importance"`
	ProposalID string    `json:"proposal_id,omitempty"` // the proposal it came from
	RunID      string    `json:"run_id,omitempty"`
	UpdatedAt  time.Time `json:"updated_at"`
}

// storeData is the file's content.
type storeData struct {
	Version  int            `json:"version"`
	Runs     []StoredRun    `json:"runs"`
	Messages []Message      `json:"messages"`
	Memories []StoredMemory `json:"memories"`
	// Decisions on permission requests (a run's tool calls that waited for approval).
	Decisions []StoredDecision `json:"decisions,omitempty"`
}

// Store is the JSON file store.
type Store struct {
	path string
	data storeData
}

// OpenStore reads the file, or starts an empty store when it does not exist yet.
func OpenStore(path string) (*Store, error) {
	s := &Store{path: path, data: storeData{Version: 1}}
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(raw, &s.data); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// Save writes the whole store atomically: a temporary file in the same directory,
// fsync, rename over the old file, fsync of the directory.
func (s *Store) Save() error {
	raw, err := json.MarshalIndent(&s.data, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(s.path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(s.path)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	if _, err := tmp.Write(append(raw, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), s.path); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil { // make the rename itself durable
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// Run returns the stored run, or nil.
func (s *Store) Run(tenant, runID string) *StoredRun {
	for i := range s.data.Runs {
		if r := &s.data.Runs[i]; r.Tenant == tenant && r.RunID == runID {
			return r
		}
	}
	return nil
}

// AddRun records a new turn and the user's message, before it is sent.
func (s *Store) AddRun(run StoredRun, userText string) {
	now := time.Now().UTC()
	run.CreatedAt, run.UpdatedAt = now, now
	s.data.Runs = append(s.data.Runs, run)
	s.data.Messages = append(s.data.Messages, Message{
		Tenant: run.Tenant, ThreadID: run.ThreadID, RunID: run.RunID,
		MessageID: run.RunID + ":user", Role: "user", Content: userText, CreatedAt: now,
	})
}

// UpdateRun sets a run's status and the last seq the gateway handled.
func (s *Store) UpdateRun(tenant, runID, status string, lastSeq uint64) {
	if r := s.Run(tenant, runID); r != nil {
		if status != "" {
			r.Status = status
		}
		if lastSeq > r.LastSeq {
			r.LastSeq = lastSeq
		}
		r.UpdatedAt = time.Now().UTC()
	}
}

// Reply returns the stored reply, or nil.
func (s *Store) Reply(tenant, runID, replyID string) *Message {
	for i := range s.data.Messages {
		m := &s.data.Messages[i]
		if m.Role == "assistant" && m.Tenant == tenant && m.RunID == runID && m.ReplyID == replyID {
			return m
		}
	}
	return nil
}

// PutReply stores a final reply once per (tenant, run_id, reply_id). It reports
// whether the reply is new; a reply already stored is left as it is.
func (s *Store) PutReply(m Message) bool {
	if s.Reply(m.Tenant, m.RunID, m.ReplyID) != nil {
		return false
	}
	m.Role = "assistant"
	m.MessageID = m.ReplyID
	m.CreatedAt = time.Now().UTC()
	s.data.Messages = append(s.data.Messages, m)
	return true
}

// History returns the last n messages of a thread, oldest first. A turn the sidecar
// never took (refused, or never reached it) is left out: nobody answered it.
func (s *Store) History(tenant, threadID string, n int) []Message {
	untaken := map[string]bool{}
	for _, r := range s.data.Runs {
		if r.Tenant == tenant && r.ThreadID == threadID && (r.Status == "rejected" || r.LastSeq == 0) {
			untaken[r.RunID] = true
		}
	}
	var out []Message
	for _, m := range s.data.Messages {
		if m.Tenant == tenant && m.ThreadID == threadID && !untaken[m.RunID] {
			out = append(out, m)
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return out
}

// Memories returns a member's memories.
func (s *Store) Memories(tenant, memberID string) []StoredMemory {
	var out []StoredMemory
	for _, m := range s.data.Memories {
		if m.Tenant == tenant && m.MemberID == memberID {
			out = append(out, m)
		}
	}
	return out
}

// PutMemory inserts a memory, or replaces the one with the same id.
func (s *Store) PutMemory(m StoredMemory) {
	m.UpdatedAt = time.Now().UTC()
	for i := range s.data.Memories {
		if old := &s.data.Memories[i]; old.Tenant == m.Tenant && old.MemoryID == m.MemoryID {
			*old = m
			return
		}
	}
	s.data.Memories = append(s.data.Memories, m)
}

// DeleteMemory forgets a memory.
func (s *Store) DeleteMemory(tenant, memoryID string) {
	kept := s.data.Memories[:0]
	for _, m := range s.data.Memories {
		if m.Tenant != tenant || m.MemoryID != memoryID {
			kept = append(kept, m)
		}
	}
	s.data.Memories = kept
}

// Decision returns the decision this gateway recorded for a permission request, or nil.
func (s *Store) Decision(tenant, runID, permissionRequestID string) *StoredDecision {
	for i := range s.data.Decisions {
		d := &s.data.Decisions[i]
		if d.Tenant == tenant && d.RunID == runID && d.PermissionRequestID == permissionRequestID {
			return d
		}
	}
	return nil
}

// PutDecision records a decision Roundtable accepted, once per permission request.
func (s *Store) PutDecision(d StoredDecision) {
	if s.Decision(d.Tenant, d.RunID, d.PermissionRequestID) == nil {
		s.data.Decisions = append(s.data.Decisions, d)
	}
}
