// Command goclient is B1's and B7's Go gateway client: the product's gateway is written in
// Go, so "end to end over gRPC" is also measured with a Go client, whose own CPU is a
// fraction of the Python client's on a 2-core host.
//
// It reads a serialized StartRunRequest (the turn's template) from -request, dials -addr and
// then serves the bench on stdin/stdout, one line per batch: "<n>" runs n turns one after
// another, each with a fresh run_id, drains every stream and answers "<mean ms per turn>",
// or "error <text>" when a turn did not end in run_completed. The bench interleaves these
// batches with its other variants, so host noise hits them alike.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	roundtablev1 "github.com/roundtable/roundtable/clients/go/roundtable/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

func main() {
	addr := flag.String("addr", "", "host:port of roundtable serve")
	requestPath := flag.String("request", "", "file holding a serialized StartRunRequest")
	prefix := flag.String("prefix", "go", "run_id prefix")
	flag.Parse()
	if err := run(*addr, *requestPath, *prefix); err != nil {
		fmt.Fprintln(os.Stderr, "goclient:", err)
		os.Exit(1)
	}
}

func run(addr, requestPath, prefix string) error {
	raw, err := os.ReadFile(requestPath)
	if err != nil {
		return err
	}
	template := &roundtablev1.StartRunRequest{}
	if err := proto.Unmarshal(raw, template); err != nil {
		return fmt.Errorf("parse %s: %w", requestPath, err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := roundtablev1.NewOrchestratorServiceClient(conn)

	in := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	next := 0
	for in.Scan() {
		n, err := strconv.Atoi(strings.TrimSpace(in.Text()))
		if err != nil || n < 1 {
			return fmt.Errorf("expected a positive turn count, got %q", in.Text())
		}
		start := time.Now()
		var failure error
		for i := 0; i < n && failure == nil; i++ {
			next++
			failure = turn(client, template, fmt.Sprintf("%s-%d", prefix, next))
		}
		if failure != nil {
			fmt.Fprintf(out, "error %s\n", strings.ReplaceAll(failure.Error(), "\n", " "))
		} else {
			perTurn := time.Since(start).Seconds() * 1000 / float64(n)
			fmt.Fprintf(out, "%.4f\n", perTurn)
		}
		if err := out.Flush(); err != nil {
			return err
		}
	}
	return in.Err()
}

// turn runs one StartRun to its end; the request is the template with a fresh run_id (a
// shallow copy of the context only: the snapshot is shared, as a gateway would build it once).
func turn(client roundtablev1.OrchestratorServiceClient, template *roundtablev1.StartRunRequest, runID string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runContext := proto.Clone(template.GetContext()).(*roundtablev1.RunContext)
	runContext.RunId = runID
	request := &roundtablev1.StartRunRequest{
		Context:     runContext,
		Snapshot:    template.GetSnapshot(),
		Credentials: template.GetCredentials(),
		Options:     template.GetOptions(),
	}
	stream, err := client.StartRun(ctx, request, grpc.WaitForReady(true))
	if err != nil {
		return err
	}
	last := ""
	for {
		response, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		last = kind(response.GetEvent())
	}
	if last != "run_completed" {
		return fmt.Errorf("turn %s ended with %q, not run_completed", runID, last)
	}
	return nil
}

func kind(event *roundtablev1.RunEvent) string {
	if event.GetRunCompleted() != nil {
		return "run_completed"
	}
	return "other"
}
