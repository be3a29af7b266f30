package main

// snapshot.go: the immutable input of one turn, built from the gateway's data. What is
// not in the snapshot does not exist for Roundtable: the roster, the members' memories
// and the thread's recent history all come from here.

import (
	"fmt"
	"os"

	roundtablev1 "github.com/roundtable/roundtable/clients/go/roundtable/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// historyLimit is how many earlier messages of the thread go into a snapshot
// (Roundtable reads the most recent 64).
const historyLimit = 64

type demoMember struct {
	id, name, persona string
	aliases, skills   []string
}

// demoRoster is four members with distinct personas, in roster (count-off) order.
var demoRoster = []demoMember{
	{"lin", "Lin", "A calm tea master who answers in gentle proverbs.", []string{"林"}, []string{"tea"}},
	{"bo", "Bo", "An impatient engineer who wants numbers and facts first.", []string{"波"}, []string{"engineering"}},
	{"mei", "Mei", "A cheerful storyteller who loves a good anecdote.", []string{"梅"}, []string{"stories"}},
	{"kai", "Kai", "A sceptic who always asks what could go wrong.", []string{"凯"}, []string{"risk"}},
}

// demoSnapshot is a group chat with the demo roster; the built-in offline model answers
// because no model is named.
func demoSnapshot() *roundtablev1.Snapshot {
	s := &roundtablev1.Snapshot{
		Session: &roundtablev1.Session{
			SessionId:       "demo",
			Kind:            roundtablev1.SessionKind_SESSION_KIND_GROUP,
			PrimaryMemberId: "lin",
		},
	}
	for _, d := range demoRoster {
		m := &roundtablev1.Member{
			MemberId: d.id, DisplayName: d.name, Aliases: d.aliases, Persona: d.persona,
			StyleRules: []string{"Keep it short."},
		}
		for _, skill := range d.skills {
			m.Skills = append(m.Skills, &roundtablev1.Skill{SkillId: skill, Name: skill})
		}
		s.Members = append(s.Members, m)
	}
	return s
}

// loadSnapshot reads a protojson roundtable.v1.Snapshot file.
func loadSnapshot(path string) (*roundtablev1.Snapshot, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s := &roundtablev1.Snapshot{}
	if err := protojson.Unmarshal(raw, s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// buildSnapshot makes the snapshot of a new turn: the roster (demo or file), the text,
// the memories the gateway keeps for each member and the thread's recent history.
func buildSnapshot(file, text string, store *Store, tenant, threadID string) (*roundtablev1.Snapshot, error) {
	s := demoSnapshot()
	if file != "" {
		var err error
		if s, err = loadSnapshot(file); err != nil {
			return nil, err
		}
	}
	if s.UserTurn == nil {
		s.UserTurn = &roundtablev1.UserTurn{}
	}
	if text != "" {
		s.UserTurn.Text = text
	}
	for _, m := range s.Members {
		for _, kept := range store.Memories(tenant, m.GetMemberId()) {
			if hasMemory(m, kept.MemoryID) {
				continue
			}
			m.Memories = append(m.Memories, &roundtablev1.Memory{
				MemoryId: kept.MemoryID, Content: kept.Content, Importance: kept.Importance,
				UpdatedAt: timestamppb.New(kept.UpdatedAt),
			})
		}
	}
	for _, h := range store.History(tenant, threadID, historyLimit) {
		role := roundtablev1.MessageRole_MESSAGE_ROLE_USER
		if h.Role == "assistant" {
			role = roundtablev1.MessageRole_MESSAGE_ROLE_ASSISTANT
		}
		s.History = append(s.History, &roundtablev1.HistoryMessage{
			MessageId: h.MessageID, Role: role, MemberId: h.MemberID, Content: h.Content,
			CreatedAt: timestamppb.New(h.CreatedAt),
		})
	}
	return s, nil
}

func hasMemory(m *roundtablev1.Member, id string) bool {
	for _, x := range m.GetMemories() {
		if x.GetMemoryId() == id {
			return true
		}
	}
	return false
}

// ToolServerID is the id of the MCP server -tool-server declares.
const ToolServerID = "tools"

// demoTools are the tools -tool-server declares on its MCP server: a lookup that runs as
// the model calls it, and a write a person approves call by call. Their input schemas
// are what the model fills in (the offline model puts the rest of "use weather for
// Paris" into the first string property).
var demoTools = []*roundtablev1.Tool{
	{
		Name:        "weather",
		Description: "The current weather in a city. Read-only: runs without asking.",
		InputSchemaJson: `{"type":"object","properties":{"city":{"type":"string","description":"The city, e.g. Paris"}},` +
			`"required":["city"],"additionalProperties":false}`,
		ServerId: ToolServerID,
		Approval: roundtablev1.ApprovalPolicy_APPROVAL_POLICY_NEVER,
		ReadOnly: true,
	},
	{
		Name:        "note",
		Description: "Writes a note for the user. A person approves each call.",
		InputSchemaJson: `{"type":"object","properties":{"text":{"type":"string","description":"What to note down"}},` +
			`"required":["text"],"additionalProperties":false}`,
		ServerId: ToolServerID,
		Approval: roundtablev1.ApprovalPolicy_APPROVAL_POLICY_ALWAYS,
	},
}

// addTools declares the MCP server at url (streamable HTTP, e.g. http://127.0.0.1:8000/mcp)
// as server "tools" with demoTools, and lets every member that has no tools of its own
// call them. A snapshot that declares tools itself (a -snapshot file) keeps them; it must
// not use the same server id or tool names.
func addTools(s *roundtablev1.Snapshot, url string) error {
	if s.Session == nil {
		s.Session = &roundtablev1.Session{}
	}
	for _, server := range s.Session.GetToolServers() {
		if server.GetServerId() == ToolServerID {
			return fmt.Errorf("-tool-server: the snapshot already declares a tool server %q", ToolServerID)
		}
	}
	names := make([]string, 0, len(demoTools))
	for _, tool := range demoTools {
		for _, declared := range s.Session.GetTools() {
			if declared.GetName() == tool.GetName() {
				return fmt.Errorf("-tool-server: the snapshot already declares a tool %q", tool.GetName())
			}
		}
		s.Session.Tools = append(s.Session.Tools, proto.Clone(tool).(*roundtablev1.Tool))
		names = append(names, tool.GetName())
	}
	s.Session.ToolServers = append(s.Session.ToolServers, &roundtablev1.ToolServer{ServerId: ToolServerID, Url: url})
	for _, m := range s.Members {
		if len(m.GetToolNames()) == 0 {
			m.ToolNames = append([]string(nil), names...)
		}
	}
	return nil
}
