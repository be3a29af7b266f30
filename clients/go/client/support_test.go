package client_test

// support_test.go: what the conformance tests (clients/conformance.md) run against: a real
// `roundtable serve` process (the binary from $ROUNDTABLE_BIN, default the repository's
// .venv/bin/roundtable), the demo roster, a loopback TCP proxy that cuts connections, a
// self-signed certificate, and the repository's test MCP tool server.

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	roundtablev1 "github.com/roundtable/roundtable/clients/go/roundtable/v1"
)

// repoRoot is the repository holding this module (clients/go).
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for ; ; dir = filepath.Dir(dir) { // the module root: clients/go
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		if dir == filepath.Dir(dir) {
			t.Fatal("no go.mod above the test")
		}
	}
	return filepath.Join(dir, "..", "..")
}

// roundtableBin is the sidecar to test against.
func roundtableBin(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("ROUNDTABLE_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(repoRoot(t), ".venv", "bin", "roundtable")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no sidecar at %s (make venv, or set ROUNDTABLE_BIN): %v", bin, err)
	}
	return bin
}

var serving = regexp.MustCompile(`roundtable serving on [\d.]+:(\d+)`)

// sidecar is one `roundtable serve` process on a fixed port and SQLite file; restartable.
type sidecar struct {
	bin  string
	port int
	db   string
	args []string
	cmd  *exec.Cmd
	done chan struct{}
	log  *os.File
}

// startSidecar starts a sidecar on a free port with its own database.
func startSidecar(t *testing.T, args ...string) *sidecar {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := t.TempDir()
	s := &sidecar{bin: roundtableBin(t), port: port, db: filepath.Join(dir, "rt.db"), args: args}
	t.Cleanup(func() { s.kill() })
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *sidecar) address() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// start runs the process and waits until it says it serves. It may run on any goroutine:
// it reports, never fails the test itself.
func (s *sidecar) start() error {
	log, err := os.CreateTemp(filepath.Dir(s.db), "rt-*.log")
	if err != nil {
		return err
	}
	s.log = log
	args := append([]string{"serve", "--listen", s.address(), "--store", "sqlite:///" + s.db}, s.args...)
	s.cmd = exec.Command(s.bin, args...)
	s.cmd.Env = append(os.Environ(), "PYTHONUNBUFFERED=1")
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		return err
	}
	s.cmd.Stdout = log
	if err := s.cmd.Start(); err != nil {
		return err
	}
	ready := make(chan struct{})
	s.done = make(chan struct{})
	go func() {
		scanner := bufio.NewScanner(stderr)
		once := sync.Once{}
		for scanner.Scan() {
			fmt.Fprintln(log, scanner.Text())
			if serving.MatchString(scanner.Text()) {
				once.Do(func() { close(ready) })
			}
		}
		_ = s.cmd.Wait()
		close(s.done)
	}()
	select {
	case <-ready:
	case <-s.done:
		return fmt.Errorf("sidecar exited: %s", s.logText())
	case <-time.After(60 * time.Second):
		return fmt.Errorf("sidecar did not serve within 60 s: %s", s.logText())
	}
	return nil
}

func (s *sidecar) logText() string {
	raw, _ := os.ReadFile(s.log.Name())
	return string(raw)
}

// signal sends sig and waits for the process to exit.
func (s *sidecar) signal(sig syscall.Signal) {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

func (s *sidecar) kill() { s.signal(syscall.SIGKILL) }

// demoRequest is a turn for the demo roster (four members, group chat, offline model).
func demoRequest(runID, threadID, text string) *roundtablev1.StartRunRequest {
	snapshot := &roundtablev1.Snapshot{
		Session: &roundtablev1.Session{
			SessionId: "demo", Kind: roundtablev1.SessionKind_SESSION_KIND_GROUP, PrimaryMemberId: "lin",
		},
		UserTurn: &roundtablev1.UserTurn{MessageId: "u-" + runID, Text: text},
	}
	for _, m := range [][3]string{
		{"lin", "Lin", "A calm tea master who answers in gentle proverbs."},
		{"bo", "Bo", "An impatient engineer who wants numbers and facts first."},
		{"mei", "Mei", "A cheerful storyteller who loves a good anecdote."},
		{"kai", "Kai", "A sceptic who always asks what could go wrong."},
	} {
		snapshot.Members = append(snapshot.Members, &roundtablev1.Member{
			MemberId: m[0], DisplayName: m[1], Persona: m[2], StyleRules: []string{"Keep it short."},
		})
	}
	return &roundtablev1.StartRunRequest{
		Context:  &roundtablev1.RunContext{RunId: runID, ThreadId: threadID, RequestId: "req-" + runID, Tenant: "demo"},
		Snapshot: snapshot,
	}
}

// toolServer is the repository's test MCP server (tests/support/mcp_server.py), run by the
// Python beside the sidecar's binary: tools weather (read-only) and note (a write that
// counts its executions per idempotency key), GET /counts.
type toolServer struct {
	port int
}

var toolServerListening = regexp.MustCompile(`mcp test server listening on port (\d+)`)

func startToolServer(t *testing.T) *toolServer {
	t.Helper()
	python := filepath.Join(filepath.Dir(roundtableBin(t)), "python")
	if _, err := os.Stat(python); err != nil {
		python = "python3"
	}
	cmd := exec.Command(python, "-m", "tests.support.mcp_server", "--port", "0")
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "PYTHONUNBUFFERED=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	log, err := os.CreateTemp(t.TempDir(), "mcp-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	port := make(chan int, 1)
	go func() {
		scanner := bufio.NewScanner(out)
		for scanner.Scan() {
			if m := toolServerListening.FindStringSubmatch(scanner.Text()); m != nil {
				var n int
				fmt.Sscan(m[1], &n)
				port <- n
			}
			fmt.Fprintln(log, scanner.Text())
		}
	}()
	select {
	case p := <-port:
		return &toolServer{port: p}
	case <-time.After(30 * time.Second):
		raw, _ := os.ReadFile(log.Name())
		t.Fatalf("the test MCP server did not listen within 30 s: %s", raw)
	}
	return nil
}

// url is the MCP endpoint (ToolServer.url).
func (s *toolServer) url() string { return fmt.Sprintf("http://127.0.0.1:%d/mcp", s.port) }

// counts is how often each tool ran, per idempotency key (GET /counts).
func (s *toolServer) counts(t *testing.T) map[string]map[string]int {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/counts", s.port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	counts := map[string]map[string]int{}
	if err := json.NewDecoder(resp.Body).Decode(&counts); err != nil {
		t.Fatal(err)
	}
	return counts
}

// toolRequest is demoRequest whose members may call the test server's weather (read-only,
// runs as called) and note (a write: each call waits for a person's approval).
func toolRequest(runID, threadID, text, url string) *roundtablev1.StartRunRequest {
	req := demoRequest(runID, threadID, text)
	session := req.Snapshot.Session
	session.ToolServers = []*roundtablev1.ToolServer{{ServerId: "tools", Url: url}}
	session.Tools = []*roundtablev1.Tool{
		{
			Name: "weather", Description: "The weather in a city.", ServerId: "tools", ReadOnly: true,
			InputSchemaJson: `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`,
			Approval:        roundtablev1.ApprovalPolicy_APPROVAL_POLICY_NEVER,
		},
		{
			Name: "note", Description: "Writes a note.", ServerId: "tools",
			InputSchemaJson: `{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`,
			Approval:        roundtablev1.ApprovalPolicy_APPROVAL_POLICY_ALWAYS,
		},
	}
	for _, m := range req.Snapshot.Members {
		m.ToolNames = []string{"weather", "note"}
	}
	return req
}

// cutProxy forwards loopback TCP to the sidecar. It cuts every open connection (both
// sides, at once, like a network failure) after the k-th gRPC message the server sent
// over the first connection, or when Cut is called.
type cutProxy struct {
	upstream string
	after    int // cut the first connection after this many response messages (0: never)
	listener net.Listener

	mu    sync.Mutex
	conns []net.Conn
	cuts  int
	conn  int
}

func startProxy(t *testing.T, upstream string, after int) *cutProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{upstream: upstream, after: after, listener: l}
	go p.serve()
	t.Cleanup(func() { l.Close(); p.Cut() })
	return p
}

func (p *cutProxy) address() string { return p.listener.Addr().String() }

func (p *cutProxy) serve() {
	for {
		down, err := p.listener.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			down.Close()
			continue
		}
		p.mu.Lock()
		p.conn++
		counting := p.conn == 1 && p.after > 0
		p.conns = append(p.conns, down, up)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(up, down); up.Close() }()
		go func() {
			if counting {
				p.forwardCounting(down, up)
			} else {
				_, _ = io.Copy(down, up)
			}
			down.Close()
		}()
	}
}

// Cut closes every open connection.
func (p *cutProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cuts++
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *cutProxy) Cuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

// forwardCounting copies server -> client HTTP/2 frame by frame, counts the gRPC messages
// in DATA frames (a 5-byte prefix, then the message), and cuts after the frame that
// completes the k-th.
func (p *cutProxy) forwardCounting(down, up net.Conn) {
	r := bufio.NewReader(up)
	need := map[uint32]int{} // stream -> bytes left of the message in progress
	header := map[uint32][]byte{}
	messages := 0
	for {
		frame := make([]byte, 9)
		if _, err := io.ReadFull(r, frame); err != nil {
			return
		}
		length := int(frame[0])<<16 | int(frame[1])<<8 | int(frame[2])
		payload := make([]byte, length)
		if _, err := io.ReadFull(r, payload); err != nil {
			return
		}
		if frame[3] == 0 { // DATA
			stream := binary.BigEndian.Uint32(frame[5:9]) & 0x7fffffff
			data := payload
			if frame[4]&0x8 != 0 && len(data) > 0 { // PADDED
				data = data[1 : len(data)-int(payload[0])]
			}
			for len(data) > 0 {
				if need[stream] == 0 { // reading a 5-byte message prefix
					take := min(5-len(header[stream]), len(data))
					header[stream] = append(header[stream], data[:take]...)
					data = data[take:]
					if len(header[stream]) == 5 {
						need[stream] = int(binary.BigEndian.Uint32(header[stream][1:5]))
						header[stream] = nil
						if need[stream] == 0 {
							messages++
						}
					}
					continue
				}
				take := min(need[stream], len(data))
				need[stream] -= take
				data = data[take:]
				if need[stream] == 0 {
					messages++
				}
			}
		}
		if _, err := down.Write(append(frame, payload...)); err != nil {
			return
		}
		if messages >= p.after {
			p.Cut()
			return
		}
	}
}

// selfSigned writes a certificate for 127.0.0.1 and its key; returns their paths and PEM.
func selfSigned(t *testing.T) (certFile, keyFile string, certPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "roundtable-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, certPEM
}

// collected is what a turn yielded.
type collected struct {
	events  []*roundtablev1.RunEvent // durable events, in the order yielded
	deltas  int
	retries []retryRecord
	err     error
}

type retryRecord struct {
	op       string
	afterSeq uint64
	lastSeen uint64 // the last durable seq the caller had when the retry was announced
	err      error
	ended    bool
}

// kinds names the payloads of durable events.
func (c *collected) kinds() []string {
	out := make([]string, 0, len(c.events))
	for _, ev := range c.events {
		out = append(out, kindOf(ev))
	}
	return out
}

func kindOf(ev *roundtablev1.RunEvent) string {
	name := fmt.Sprintf("%T", ev.GetPayload())
	name = strings.TrimPrefix(name, "*roundtablev1.RunEvent_")
	var b strings.Builder
	for i, r := range name {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToLower(b.String())
}

func (c *collected) finals() []*roundtablev1.AssistantFinal {
	var out []*roundtablev1.AssistantFinal
	for _, ev := range c.events {
		if f := ev.GetAssistantFinal(); f != nil {
			out = append(out, f)
		}
	}
	return out
}

// checkExactlyOnce fails unless durable seqs run 1, 2, 3... with no repeat, the last event
// is run_completed, and each reply's final came once, from the four members in roster order.
func (c *collected) checkCompletedOnce(t *testing.T) {
	t.Helper()
	if c.err != nil {
		t.Fatalf("turn failed: %v", c.err)
	}
	for i, ev := range c.events {
		if ev.GetSeq() != uint64(i+1) {
			t.Fatalf("event %d has seq %d (want %d): %v", i, ev.GetSeq(), i+1, c.kinds())
		}
	}
	if n := len(c.events); n == 0 || c.events[n-1].GetRunCompleted() == nil {
		t.Fatalf("not ended by run_completed: %v", c.kinds())
	}
	seen := map[string]bool{}
	var members []string
	for _, f := range c.finals() {
		if seen[f.GetReplyId()] {
			t.Fatalf("assistant_final of %s yielded twice", f.GetReplyId())
		}
		seen[f.GetReplyId()] = true
		members = append(members, f.GetMemberId())
	}
	if strings.Join(members, ",") != "lin,bo,mei,kai" {
		t.Fatalf("finals from %v, want lin,bo,mei,kai", members)
	}
}

// ctxFor is a test's deadline.
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
