// Package idempotency is a small Go client of the idempotency coordinator
// (idempotency.v1.CoordinatorService), over the code clients/generate.sh
// generates from proto/ with Debian's protoc-gen-go and protoc-gen-go-grpc.
//
// Every call sends the caller's bearer token, gets a deadline (the context's,
// or the client's default timeout when the context has none), and returns an
// *Error when the coordinator refuses, whose Reason is read from the
// google.rpc.ErrorInfo detail of the call's status:
//
//	c, err := idempotency.Dial("127.0.0.1:7070", token)
//	r, err := c.Reserve(ctx, idempotency.ReserveArgs{Tenant: "acme", Principal: "alice",
//		Operation: "payments.create", APIRevision: 1, Key: key,
//		Parts: &pb.HttpRequestParts{Method: "POST", Path: "/v1/payments", Body: body}, Claim: true})
//	...
//	if _, err := c.Complete(ctx, ref, gen, pb.Outcome_OUTCOME_SUCCEEDED, snapshot); err != nil {
//		if idempotency.ReasonOf(err) == "STALE_GENERATION" { /* someone took over: stop */ }
//	}
package idempotency

import (
	"context"
	"errors"
	"time"

	pb "github.com/idempotency-coordinator/idempotency-coordinator/clients/go/gen/idempotency/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"
)

// DefaultTimeout is the deadline of a call whose context has none.
const DefaultTimeout = 10 * time.Second

// Client calls the coordinator with one caller's bearer token.
type Client struct {
	conn    *grpc.ClientConn
	ownConn bool
	stub    pb.CoordinatorServiceClient
	token   string
	// Timeout is the deadline of a call whose context has none (DefaultTimeout).
	Timeout time.Duration
}

// Dial connects to target ("host:port") over HTTP/2 cleartext. An empty token
// sends no Authorization header (every RPC is then refused UNAUTHENTICATED).
// Extra dial options may be given (e.g. transport credentials instead of the
// default insecure ones).
func Dial(target, token string, opts ...grpc.DialOption) (*Client, error) {
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithInsecure()}
	}
	conn, err := grpc.Dial(target, opts...)
	if err != nil {
		return nil, err
	}
	c := New(conn, token)
	c.ownConn = true
	return c, nil
}

// New wraps an existing connection (not closed by Close).
func New(conn *grpc.ClientConn, token string) *Client {
	return &Client{conn: conn, stub: pb.NewCoordinatorServiceClient(conn), token: token, Timeout: DefaultTimeout}
}

// Close closes the connection Dial opened.
func (c *Client) Close() error {
	if c.ownConn {
		return c.conn.Close()
	}
	return nil
}

// call gives ctx the token and a deadline, and turns a refusal into *Error.
func (c *Client) call(ctx context.Context, do func(ctx context.Context) error) error {
	if _, ok := ctx.Deadline(); !ok && c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	if c.token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.token)
	}
	if err := do(ctx); err != nil {
		return FromError(err)
	}
	return nil
}

// Ref names an accepted operation for the writes that follow Reserve.
func Ref(tenant, operationID string) *pb.OperationRef {
	return &pb.OperationRef{Tenant: tenant, OperationId: operationID}
}

func duration(d time.Duration) *durationpb.Duration {
	if d <= 0 {
		return nil
	}
	return durationpb.New(d)
}

// ReserveArgs are the arguments of Reserve.
type ReserveArgs struct {
	Tenant, Principal string
	Operation         string
	APIRevision       uint32
	Key               string
	// Parts identifies the request by its raw parts; Fingerprint by a digest
	// computed with the published algorithm. One is required.
	Parts       *pb.HttpRequestParts
	Fingerprint *pb.PrecomputedFingerprint
	// Claim starts executing at once when accepted.
	Claim bool
	// Lease is the lease to hold (0: the policy's default).
	Lease       time.Duration
	WriterEpoch uint64
}

// Reserve decides what to do with one request (the acceptance point); check
// the response's Decision.
func (c *Client) Reserve(ctx context.Context, a ReserveArgs) (*pb.ReserveResponse, error) {
	req := &pb.ReserveRequest{
		Subject:        &pb.Subject{Tenant: a.Tenant, Principal: a.Principal},
		Operation:      a.Operation,
		ApiRevision:    a.APIRevision,
		IdempotencyKey: a.Key,
		Claim:          a.Claim,
		Lease:          duration(a.Lease),
		WriterEpoch:    a.WriterEpoch,
	}
	switch {
	case a.Fingerprint != nil:
		req.Request = &pb.ReserveRequest_Fingerprint{Fingerprint: a.Fingerprint}
	case a.Parts != nil:
		req.Request = &pb.ReserveRequest_Parts{Parts: a.Parts}
	default:
		return nil, errors.New("idempotency: Reserve needs Parts or Fingerprint")
	}
	var res *pb.ReserveResponse
	err := c.call(ctx, func(ctx context.Context) (err error) { res, err = c.stub.Reserve(ctx, req); return })
	return res, err
}

// Claim takes ownership for execution (OWNER, TAKEOVER or RECOVER). lease 0
// means the policy's default.
func (c *Client) Claim(ctx context.Context, ref *pb.OperationRef, generation uint64, mode pb.ClaimMode, lease time.Duration) (*pb.ClaimResponse, error) {
	req := &pb.ClaimRequest{Ref: ref, Mode: mode, Generation: generation, Lease: duration(lease)}
	var res *pb.ClaimResponse
	err := c.call(ctx, func(ctx context.Context) (err error) { res, err = c.stub.Claim(ctx, req); return })
	return res, err
}

// RenewLease extends the lease of the generation you hold.
func (c *Client) RenewLease(ctx context.Context, ref *pb.OperationRef, generation uint64, lease time.Duration) (*pb.RenewLeaseResponse, error) {
	req := &pb.RenewLeaseRequest{Ref: ref, Generation: generation, Lease: duration(lease)}
	var res *pb.RenewLeaseResponse
	err := c.call(ctx, func(ctx context.Context) (err error) { res, err = c.stub.RenewLease(ctx, req); return })
	return res, err
}

// RecordEffectAttempt registers a downstream call before making it; send
// res.Attempt.DownstreamKey downstream.
func (c *Client) RecordEffectAttempt(ctx context.Context, ref *pb.OperationRef, generation uint64, effect, provider string) (*pb.RecordEffectAttemptResponse, error) {
	req := &pb.RecordEffectAttemptRequest{Ref: ref, Generation: generation, Effect: effect, Provider: provider}
	var res *pb.RecordEffectAttemptResponse
	err := c.call(ctx, func(ctx context.Context) (err error) { res, err = c.stub.RecordEffectAttempt(ctx, req); return })
	return res, err
}

// ResolveEffectAttempt records what the downstream call did.
func (c *Client) ResolveEffectAttempt(ctx context.Context, ref *pb.OperationRef, generation uint64, attempt uint32, st pb.EffectStatus, providerHandle string) (*pb.ResolveEffectAttemptResponse, error) {
	req := &pb.ResolveEffectAttemptRequest{Ref: ref, Generation: generation, AttemptNumber: attempt, Status: st, ProviderHandle: providerHandle}
	var res *pb.ResolveEffectAttemptResponse
	err := c.call(ctx, func(ctx context.Context) (err error) { res, err = c.stub.ResolveEffectAttempt(ctx, req); return })
	return res, err
}

// Complete finishes the operation with an outcome and the response to replay.
func (c *Client) Complete(ctx context.Context, ref *pb.OperationRef, generation uint64, outcome pb.Outcome, snapshot *pb.ResponseSnapshot) (*pb.CompleteResponse, error) {
	req := &pb.CompleteRequest{Ref: ref, Generation: generation, Outcome: outcome, Snapshot: snapshot}
	var res *pb.CompleteResponse
	err := c.call(ctx, func(ctx context.Context) (err error) { res, err = c.stub.Complete(ctx, req); return })
	return res, err
}

// Release hands a reservation back without any effect.
func (c *Client) Release(ctx context.Context, ref *pb.OperationRef, generation uint64) (*pb.ReleaseResponse, error) {
	req := &pb.ReleaseRequest{Ref: ref, Generation: generation}
	var res *pb.ReleaseResponse
	err := c.call(ctx, func(ctx context.Context) (err error) { res, err = c.stub.Release(ctx, req); return })
	return res, err
}

// Lookup reads an operation by id as subject (tenant and principal).
func (c *Client) Lookup(ctx context.Context, subject *pb.Subject, operationID string) (*pb.LookupResponse, error) {
	req := &pb.LookupRequest{By: &pb.LookupRequest_Ref{Ref: Ref(subject.GetTenant(), operationID)}, Subject: subject}
	return c.lookup(ctx, req)
}

// LookupScope reads an operation by the scope a request would have.
func (c *Client) LookupScope(ctx context.Context, scope *pb.ScopeLookup) (*pb.LookupResponse, error) {
	req := &pb.LookupRequest{By: &pb.LookupRequest_Scope{Scope: scope}, Subject: scope.GetSubject()}
	return c.lookup(ctx, req)
}

func (c *Client) lookup(ctx context.Context, req *pb.LookupRequest) (*pb.LookupResponse, error) {
	var res *pb.LookupResponse
	err := c.call(ctx, func(ctx context.Context) (err error) { res, err = c.stub.Lookup(ctx, req); return })
	return res, err
}
