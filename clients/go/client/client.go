// Package client is the Roundtable client library: one call that runs a turn and yields
// its events exactly once, in seq order, through dropped streams, sidecar restarts and
// retryable failures; CancelRun, GetRun and ResolvePermission; errors typed by the
// contract's reasons.
//
// It wraps the generated package github.com/roundtable/roundtable/clients/go/roundtable/v1
// and implements the policy of clients/conformance.md, which the Python and TypeScript
// libraries share.
package client

import (
	"context"
	"crypto/tls"

	roundtablev1 "github.com/roundtable/roundtable/clients/go/roundtable/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// ContractVersion is the contract this library speaks: the proto package roundtable.v1.
const ContractVersion = "roundtable.v1"

// Client calls one sidecar (or a set of replicas behind one target).
type Client struct {
	stub roundtablev1.OrchestratorServiceClient
}

// New returns a client over a connection (grpc.NewClient or Dial).
func New(cc grpc.ClientConnInterface) *Client {
	return &Client{stub: roundtablev1.NewOrchestratorServiceClient(cc)}
}

// Wrap returns a client over a generated stub, or anything that implements it (a test
// double, an instrumented wrapper).
func Wrap(stub roundtablev1.OrchestratorServiceClient) *Client {
	return &Client{stub: stub}
}

// Stub is the generated client underneath, for calls this package does not wrap.
func (c *Client) Stub() roundtablev1.OrchestratorServiceClient { return c.stub }

// DialOptions say how Dial connects.
type DialOptions struct {
	// TLS connects with TLS (nil: plaintext, for loopback).
	TLS *tls.Config
	// Token is sent as `authorization: Bearer <token>` on every call (needs TLS, or
	// grpc refuses to send it; over plaintext set InsecureToken on loopback only).
	Token string
	// InsecureToken allows sending Token without TLS (loopback tests).
	InsecureToken bool
	// Extra dial options (a stats handler for tracing, say).
	Extra []grpc.DialOption
}

// Dial opens a connection to target (host:port) with TLS and a bearer token as asked.
func Dial(target string, o DialOptions) (*grpc.ClientConn, error) {
	transport := insecure.NewCredentials()
	if o.TLS != nil {
		transport = credentials.NewTLS(o.TLS)
	}
	options := []grpc.DialOption{grpc.WithTransportCredentials(transport)}
	if o.Token != "" {
		options = append(options, grpc.WithPerRPCCredentials(BearerToken{Token: o.Token, AllowInsecure: o.InsecureToken}))
	}
	return grpc.NewClient(target, append(options, o.Extra...)...)
}

// BearerToken sends `authorization: Bearer <Token>` on every call.
type BearerToken struct {
	Token         string
	AllowInsecure bool // also over plaintext (grpc refuses otherwise)
}

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b BearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.Token}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials.
func (b BearerToken) RequireTransportSecurity() bool { return !b.AllowInsecure }

// Cancel asks a run to stop (gracefully at the next speaker boundary, or immediately);
// reason is optional. Errors are *Error.
func (c *Client) Cancel(ctx context.Context, runID, tenant string, mode roundtablev1.CancelMode, reason string) (*roundtablev1.CancelRunResponse, error) {
	resp, err := c.stub.CancelRun(ctx, &roundtablev1.CancelRunRequest{RunId: runID, Tenant: tenant, Mode: mode, Reason: reason})
	if err != nil {
		return nil, AsError(err)
	}
	return resp, nil
}

// GetRun reads a run: status, plan, finished replies, last seq. Errors are *Error.
func (c *Client) GetRun(ctx context.Context, runID, tenant string) (*roundtablev1.Run, error) {
	resp, err := c.stub.GetRun(ctx, &roundtablev1.GetRunRequest{RunId: runID, Tenant: tenant})
	if err != nil {
		return nil, AsError(err)
	}
	return resp.GetRun(), nil
}

// ResolvePermission answers a permission_required event (PermissionRequired.permission_request_id):
// APPROVE runs the tool call, with editedArgumentsJSON (a JSON object) instead of the
// model's arguments when it is not empty; DENY tells the member reason instead (optional).
// The run waits meanwhile with its stream open and goes on once the decision is recorded:
// keep reading RunTurn's events. The same decision sent again answers the same. Errors are
// *Error; tell them apart by Reason: ReasonPermissionDecided (another decision, an expiry or
// a cancel was recorded first; the message names it), ReasonPermissionNotFound,
// ReasonRunNotFound, ReasonInvalidRequest.
func (c *Client) ResolvePermission(ctx context.Context, runID, tenant, permissionRequestID string,
	decision roundtablev1.PermissionDecision, reason, editedArgumentsJSON string) (*roundtablev1.ResolvePermissionResponse, error) {
	resp, err := c.stub.ResolvePermission(ctx, &roundtablev1.ResolvePermissionRequest{
		RunId: runID, Tenant: tenant, PermissionRequestId: permissionRequestID, Decision: decision,
		Reason: reason, EditedArgumentsJson: editedArgumentsJSON,
	})
	if err != nil {
		return nil, AsError(err)
	}
	return resp, nil
}
