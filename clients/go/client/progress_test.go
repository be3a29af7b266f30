package client

import (
	"context"
	"io"
	"testing"
	"time"

	roundtablev1 "github.com/roundtable/roundtable/clients/go/roundtable/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// failingSidecar answers StartRun with the run's log from seq 1; each call adds an
// execution that begins a speaker and fails retryably (as a run whose tool result the store
// cannot take did). Past five calls it refuses: the test then fails instead of hanging.
type failingSidecar struct {
	roundtablev1.OrchestratorServiceClient // other calls are not made
	calls                                  int
	log                                    []*roundtablev1.RunEvent
}

func (f *failingSidecar) add(e *roundtablev1.RunEvent) {
	e.RunId, e.Seq = "p1", uint64(len(f.log)+1)
	f.log = append(f.log, e)
}

func (f *failingSidecar) StartRun(ctx context.Context, _ *roundtablev1.StartRunRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[roundtablev1.StartRunResponse], error) {
	f.calls++
	if f.calls > 5 {
		return nil, status.Error(codes.FailedPrecondition, "resent without end")
	}
	f.add(&roundtablev1.RunEvent{Payload: &roundtablev1.RunEvent_RunStarted{RunStarted: &roundtablev1.RunStarted{Resumed: f.calls > 1}}})
	f.add(&roundtablev1.RunEvent{Payload: &roundtablev1.RunEvent_SpeakerStarted{SpeakerStarted: &roundtablev1.SpeakerStarted{MemberId: "a", Attempt: 1}}})
	f.add(&roundtablev1.RunEvent{Payload: &roundtablev1.RunEvent_RunFailed{RunFailed: &roundtablev1.RunFailed{Code: "INTERNAL", Retryable: true}}})
	return &logStream{events: append([]*roundtablev1.RunEvent(nil), f.log...)}, nil
}

type logStream struct {
	grpc.ServerStreamingClient[roundtablev1.StartRunResponse]
	events []*roundtablev1.RunEvent
}

func (s *logStream) Recv() (*roundtablev1.StartRunResponse, error) {
	if len(s.events) == 0 {
		return nil, io.EOF
	}
	e := s.events[0]
	s.events = s.events[1:]
	return &roundtablev1.StartRunResponse{Event: e}, nil
}

// An execution that fails the same way each time after beginning a speaker is no progress:
// the turn sends StartRun MaxAttempts times, not without end (each execution's
// speaker_started counted as progress before).
func TestExecutionsThatFailAfterBeginningASpeakerAreNoProgress(t *testing.T) {
	fake := &failingSidecar{}
	opts := DefaultOptions()
	opts.MaxAttempts, opts.InitialBackoff, opts.MaxBackoff = 3, time.Millisecond, time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var seqs []uint64
	var last *roundtablev1.RunEvent
	for ev, err := range Wrap(fake).RunTurn(ctx, &roundtablev1.StartRunRequest{}, &opts) {
		if err != nil {
			t.Fatalf("after %d calls: %v", fake.calls, err)
		}
		seqs, last = append(seqs, ev.GetSeq()), ev
	}
	if fake.calls != 3 {
		t.Fatalf("StartRun sent %d times, want 3", fake.calls)
	}
	if !last.GetRunFailed().GetRetryable() {
		t.Fatalf("the turn ended with %v, want the retryable run_failed", last)
	}
	for i, seq := range seqs {
		if seq != uint64(i+1) {
			t.Fatalf("seqs %v: every durable event once, in order", seqs)
		}
	}
}
