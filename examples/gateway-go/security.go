package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// security is how the gateway proves who it is to the sidecar: a bearer token mapped to
// tenants by `roundtable serve --auth-tokens`, TLS, and optionally a client certificate
// whose common name maps to tenants (--auth-certificate-tenants, mutual TLS).
type security struct {
	tokenFile, caFile, certFile, keyFile string
}

// dialOptions turns the flags into gRPC dial options: transport credentials (TLS or
// plaintext) and, with a token, per-RPC credentials that send `authorization: Bearer`.
func (s security) dialOptions(target string) ([]grpc.DialOption, error) {
	token := os.Getenv("ROUNDTABLE_TOKEN")
	if s.tokenFile != "" {
		data, err := os.ReadFile(s.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("token file: %w", err)
		}
		token = strings.TrimSpace(string(data))
	}
	if (s.certFile == "") != (s.keyFile == "") {
		return nil, errors.New("-tls-cert and -tls-key go together")
	}
	if s.certFile != "" && s.caFile == "" {
		return nil, errors.New("-tls-cert needs -tls-ca")
	}
	transport := insecure.NewCredentials()
	if s.caFile != "" {
		pem, err := os.ReadFile(s.caFile)
		if err != nil {
			return nil, fmt.Errorf("tls ca: %w", err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls ca: no certificate in %s", s.caFile)
		}
		config := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		if s.certFile != "" {
			pair, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
			if err != nil {
				return nil, fmt.Errorf("tls client certificate: %w", err)
			}
			config.Certificates = []tls.Certificate{pair}
		}
		transport = credentials.NewTLS(config)
	}
	options := []grpc.DialOption{grpc.WithTransportCredentials(transport)}
	if token != "" {
		if s.caFile == "" && !loopback(target) {
			// A bearer token over plaintext is readable by anyone on the path.
			return nil, fmt.Errorf("refusing to send a token in cleartext to %s: pass -tls-ca (or use a loopback address)", target)
		}
		options = append(options, grpc.WithPerRPCCredentials(bearer{token: token, tls: s.caFile != ""}))
	}
	return options, nil
}

// bearer sends a token as `authorization: Bearer <token>` on every call.
type bearer struct {
	token string
	tls   bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.tls }

// loopback says whether a dial target ("host:port", "dns:///host:port", "unix:...") is
// this machine, where plaintext never leaves it.
func loopback(target string) bool {
	if strings.HasPrefix(target, "unix:") {
		return true
	}
	if i := strings.LastIndex(target, "/"); i >= 0 {
		target = target[i+1:]
	}
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		host = target
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
