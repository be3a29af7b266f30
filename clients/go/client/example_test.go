package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/roundtable/roundtable/clients/go/client"
	roundtablev1 "github.com/roundtable/roundtable/clients/go/roundtable/v1"
)

// A turn against `make run`: every durable event once, in seq order, whatever drops.
func ExampleClient_RunTurn() {
	conn, err := client.Dial("127.0.0.1:50051", client.DialOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	c := client.New(conn)

	req := &roundtablev1.StartRunRequest{
		Context: &roundtablev1.RunContext{RunId: "run-1", ThreadId: "thread-1", RequestId: "req-1", Tenant: "demo"},
		Snapshot: &roundtablev1.Snapshot{
			Session: &roundtablev1.Session{SessionId: "s-1", Kind: roundtablev1.SessionKind_SESSION_KIND_GROUP, PrimaryMemberId: "lin"},
			Members: []*roundtablev1.Member{
				{MemberId: "lin", DisplayName: "Lin"}, {MemberId: "bo", DisplayName: "Bo"},
			},
			UserTurn: &roundtablev1.UserTurn{MessageId: "m-1", Text: "大家报数！"},
		},
	}
	for ev, err := range c.RunTurn(context.Background(), req, nil) {
		if err != nil {
			var e *client.Error // typed by the contract: Code, Reason, RetryDelay, Violations...
			if errors.As(err, &e) && e.Reason == client.ReasonInvalidRequest {
				log.Fatalf("bad request: %v", e.Violations)
			}
			log.Fatal(err)
		}
		if f := ev.GetAssistantFinal(); f != nil { // store it once per (run_id, reply_id)
			fmt.Printf("%s: %s\n", f.GetMemberId(), f.GetContent())
		}
	}
}
