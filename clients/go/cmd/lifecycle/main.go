// Command lifecycle runs the full life cycle of one operation against a
// running coordinator with the Go client, the same checks as
// clients/python/test_lifecycle.py.
//
// Environment: IDEM_TARGET (host:port), IDEM_GATEWAY_TOKEN, IDEM_WORKER_TOKEN,
// and optionally IDEM_TENANT (acme), IDEM_PRINCIPAL (go-client),
// IDEM_OPERATION (payments.create), IDEM_API_REVISION (1).
//
// It prints one line per check ("PASS <check>: …" or "FAIL <check>: …") and
// exits 1 at the first failure, 2 on bad usage.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	pb "github.com/idempotency-coordinator/idempotency-coordinator/clients/go/gen/idempotency/v1"
	"github.com/idempotency-coordinator/idempotency-coordinator/clients/go/idempotency"
	"google.golang.org/grpc/codes"
)

// uuid4 is a random RFC 4122 version 4 UUID.
func uuid4() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

func env(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

type check struct {
	name string
	run  func(ctx context.Context) (string, error)
}

func expectRefusal(err error, code codes.Code, reason string) (*idempotency.Error, error) {
	if err == nil {
		return nil, fmt.Errorf("expected %s %s, got a response", code, reason)
	}
	e := idempotency.FromError(err)
	if e.Code != code || e.Reason != reason || e.Domain != idempotency.Domain {
		return nil, fmt.Errorf("got %s reason %q domain %q, expected %s %s (%v)", e.Code, e.Reason, e.Domain, code, reason, err)
	}
	return e, nil
}

func main() {
	target, gatewayToken, workerToken := os.Getenv("IDEM_TARGET"), os.Getenv("IDEM_GATEWAY_TOKEN"), os.Getenv("IDEM_WORKER_TOKEN")
	if target == "" || gatewayToken == "" || workerToken == "" {
		fmt.Fprintln(os.Stderr, "set IDEM_TARGET, IDEM_GATEWAY_TOKEN and IDEM_WORKER_TOKEN")
		os.Exit(2)
	}
	tenant := env("IDEM_TENANT", "acme")
	principal := env("IDEM_PRINCIPAL", "go-client")
	operation := env("IDEM_OPERATION", "payments.create")
	rev, err := strconv.ParseUint(env("IDEM_API_REVISION", "1"), 10, 32)
	if err != nil {
		fmt.Fprintln(os.Stderr, "IDEM_API_REVISION must be a number")
		os.Exit(2)
	}
	revision := uint32(rev)

	dial := func(token string) *idempotency.Client {
		c, err := idempotency.Dial(target, token)
		if err != nil {
			fmt.Fprintf(os.Stderr, "dial %s: %v\n", target, err)
			os.Exit(1)
		}
		return c
	}
	gateway, worker, anonymous := dial(gatewayToken), dial(workerToken), dial("")
	defer gateway.Close()
	defer worker.Close()
	defer anonymous.Close()

	key := uuid4()
	payload, _ := json.Marshal(map[string]interface{}{"amount": 10, "currency": "EUR"})
	otherPayload, _ := json.Marshal(map[string]interface{}{"amount": 100, "currency": "EUR"})
	snapshotBody, _ := json.Marshal(map[string]interface{}{"id": "pay_" + uuid4()[:8], "amount": 10, "status": "captured"})
	snapshot := func() *pb.ResponseSnapshot {
		return &pb.ResponseSnapshot{StatusCode: 201, MediaType: "application/json", Location: "/v1/payments/1", Body: snapshotBody}
	}
	parts := func(body []byte) *pb.HttpRequestParts {
		return &pb.HttpRequestParts{Method: "POST", Path: "/v1/payments", MediaType: "application/json", Body: body}
	}
	reserveArgs := func(body []byte, claim bool) idempotency.ReserveArgs {
		return idempotency.ReserveArgs{Tenant: tenant, Principal: principal, Operation: operation, APIRevision: revision,
			Key: key, Parts: parts(body), Claim: claim}
	}

	var ref *pb.OperationRef
	var generation uint64
	var attempt uint32
	var digest []byte

	checks := []check{
		{"reserve-accepted", func(ctx context.Context) (string, error) {
			r, err := gateway.Reserve(ctx, reserveArgs(payload, true))
			if err != nil {
				return "", err
			}
			if r.Decision != pb.Decision_DECISION_ACCEPTED || r.Generation != 1 || r.State != pb.RecordState_RECORD_STATE_EXECUTING || len(r.OperationId) != 36 {
				return "", fmt.Errorf("decision %s, generation %d, state %s, operation id %q", r.Decision, r.Generation, r.State, r.OperationId)
			}
			ref, generation = idempotency.Ref(tenant, r.OperationId), r.Generation
			return fmt.Sprintf("ACCEPTED, generation 1, EXECUTING, operation %s", r.OperationId), nil
		}},
		{"reserve-in-progress", func(ctx context.Context) (string, error) {
			r, err := gateway.Reserve(ctx, reserveArgs(payload, false))
			if err != nil {
				return "", err
			}
			if r.Decision != pb.Decision_DECISION_IN_PROGRESS || r.OperationId != ref.OperationId || r.Generation != 0 {
				return "", fmt.Errorf("decision %s, operation id %q, generation %d", r.Decision, r.OperationId, r.Generation)
			}
			return fmt.Sprintf("IN_PROGRESS, retry after %s", r.RetryAfter.AsDuration()), nil
		}},
		{"reserve-payload-conflict", func(ctx context.Context) (string, error) {
			r, err := gateway.Reserve(ctx, reserveArgs(otherPayload, false))
			if err != nil {
				return "", err
			}
			if r.Decision != pb.Decision_DECISION_PAYLOAD_CONFLICT || r.OperationId != "" {
				return "", fmt.Errorf("decision %s, operation id %q", r.Decision, r.OperationId)
			}
			return "PAYLOAD_CONFLICT, nothing revealed", nil
		}},
		{"record-effect-attempt", func(ctx context.Context) (string, error) {
			r, err := gateway.RecordEffectAttempt(ctx, ref, generation, "card.charge", "card-provider")
			if err != nil {
				return "", err
			}
			a := r.Attempt
			if len(a.DownstreamKey) != 43 || a.Status != pb.EffectStatus_EFFECT_STATUS_PENDING || a.AttemptNumber != 1 {
				return "", fmt.Errorf("downstream key %q (%d chars), status %s, attempt %d", a.DownstreamKey, len(a.DownstreamKey), a.Status, a.AttemptNumber)
			}
			attempt = a.AttemptNumber
			return fmt.Sprintf("attempt 1 PENDING, downstream key %s (43 chars)", a.DownstreamKey), nil
		}},
		{"resolve-confirmed", func(ctx context.Context) (string, error) {
			r, err := gateway.ResolveEffectAttempt(ctx, ref, generation, attempt, pb.EffectStatus_EFFECT_STATUS_CONFIRMED, "ch_123")
			if err != nil {
				return "", err
			}
			if r.Attempt.Status != pb.EffectStatus_EFFECT_STATUS_CONFIRMED || r.Attempt.ProviderHandle != "ch_123" {
				return "", fmt.Errorf("status %s, handle %q", r.Attempt.Status, r.Attempt.ProviderHandle)
			}
			return fmt.Sprintf("attempt %d CONFIRMED (provider handle ch_123)", attempt), nil
		}},
		{"complete-succeeded", func(ctx context.Context) (string, error) {
			r, err := gateway.Complete(ctx, ref, generation, pb.Outcome_OUTCOME_SUCCEEDED, snapshot())
			if err != nil {
				return "", err
			}
			if r.State != pb.RecordState_RECORD_STATE_SUCCEEDED || len(r.SnapshotDigest) != 32 {
				return "", fmt.Errorf("state %s, digest %x", r.State, r.SnapshotDigest)
			}
			digest = r.SnapshotDigest
			return fmt.Sprintf("SUCCEEDED, snapshot digest %x…", digest[:8]), nil
		}},
		{"complete-repeat", func(ctx context.Context) (string, error) {
			r, err := gateway.Complete(ctx, ref, generation, pb.Outcome_OUTCOME_SUCCEEDED, snapshot())
			if err != nil {
				return "", err
			}
			if !bytes.Equal(r.SnapshotDigest, digest) {
				return "", fmt.Errorf("a repeated identical Complete changed the digest")
			}
			return "identical Complete accepted again, same digest", nil
		}},
		{"reserve-replay", func(ctx context.Context) (string, error) {
			r, err := gateway.Reserve(ctx, reserveArgs(payload, false))
			if err != nil {
				return "", err
			}
			if r.Decision != pb.Decision_DECISION_REPLAY {
				return "", fmt.Errorf("decision %s", r.Decision)
			}
			s := r.Snapshot
			if !bytes.Equal(s.GetBody(), snapshotBody) || s.GetStatusCode() != 201 || !bytes.Equal(s.GetDigest(), digest) {
				return "", fmt.Errorf("replayed snapshot differs: status %d, body %q, digest %x", s.GetStatusCode(), s.GetBody(), s.GetDigest())
			}
			return "REPLAY, byte-identical body, same digest", nil
		}},
		{"lookup", func(ctx context.Context) (string, error) {
			r, err := worker.Lookup(ctx, &pb.Subject{Tenant: tenant, Principal: principal}, ref.OperationId)
			if err != nil {
				return "", err
			}
			rec := r.Record
			if rec.State != pb.RecordState_RECORD_STATE_SUCCEEDED || len(rec.EffectAttempts) != 1 ||
				rec.EffectAttempts[0].Status != pb.EffectStatus_EFFECT_STATUS_CONFIRMED || !bytes.Equal(rec.Snapshot.GetDigest(), digest) {
				return "", fmt.Errorf("state %s, %d attempts, digest %x", rec.State, len(rec.EffectAttempts), rec.Snapshot.GetDigest())
			}
			return "worker token: SUCCEEDED, 1 CONFIRMED effect attempt, same digest", nil
		}},
		{"stale-generation", func(ctx context.Context) (string, error) {
			_, err := gateway.Complete(ctx, ref, 2, pb.Outcome_OUTCOME_SUCCEEDED, snapshot())
			e, failure := expectRefusal(err, codes.FailedPrecondition, "STALE_GENERATION")
			if failure != nil {
				return "", failure
			}
			if e.Metadata["current_generation"] != "1" {
				return "", fmt.Errorf("metadata %v", e.Metadata)
			}
			return fmt.Sprintf("%s %s (current_generation=%s)", e.Code, e.Reason, e.Metadata["current_generation"]), nil
		}},
		{"invalid-key", func(ctx context.Context) (string, error) {
			args := reserveArgs(payload, false)
			args.Key = "too-short"
			_, err := gateway.Reserve(ctx, args)
			e, failure := expectRefusal(err, codes.InvalidArgument, "INVALID_KEY")
			if failure != nil {
				return "", failure
			}
			return fmt.Sprintf("%s %s", e.Code, e.Reason), nil
		}},
		{"unauthenticated", func(ctx context.Context) (string, error) {
			args := reserveArgs(payload, false)
			args.Key = uuid4()
			_, err := anonymous.Reserve(ctx, args)
			e, failure := expectRefusal(err, codes.Unauthenticated, "UNAUTHENTICATED")
			if failure != nil {
				return "", failure
			}
			return fmt.Sprintf("%s %s", e.Code, e.Reason), nil
		}},
		{"permission-denied", func(ctx context.Context) (string, error) {
			args := reserveArgs(payload, false)
			args.Key, args.Tenant = uuid4(), "globex"
			_, err := gateway.Reserve(ctx, args)
			e, failure := expectRefusal(err, codes.PermissionDenied, "PERMISSION_DENIED")
			if failure != nil {
				return "", failure
			}
			return fmt.Sprintf("%s %s (tenant globex)", e.Code, e.Reason), nil
		}},
		{"claim-release-takeover", func(ctx context.Context) (string, error) {
			args := reserveArgs(payload, false)
			args.Key = uuid4()
			r, err := gateway.Reserve(ctx, args)
			if err != nil {
				return "", err
			}
			if r.Decision != pb.Decision_DECISION_ACCEPTED || r.State != pb.RecordState_RECORD_STATE_RESERVED {
				return "", fmt.Errorf("decision %s, state %s", r.Decision, r.State)
			}
			ref2 := idempotency.Ref(tenant, r.OperationId)
			c, err := gateway.Claim(ctx, ref2, r.Generation, pb.ClaimMode_CLAIM_MODE_OWNER, 0)
			if err != nil {
				return "", err
			}
			if c.State != pb.RecordState_RECORD_STATE_EXECUTING || c.Generation != 1 {
				return "", fmt.Errorf("claim: state %s, generation %d", c.State, c.Generation)
			}
			rel, err := gateway.Release(ctx, ref2, c.Generation)
			if err != nil {
				return "", err
			}
			if rel.State != pb.RecordState_RECORD_STATE_RESERVED || rel.Generation != 1 {
				return "", fmt.Errorf("release: state %s, generation %d", rel.State, rel.Generation)
			}
			again, err := gateway.Reserve(ctx, args)
			if err != nil {
				return "", err
			}
			if again.Decision != pb.Decision_DECISION_ACCEPTED || again.Generation != 2 || again.OperationId != r.OperationId {
				return "", fmt.Errorf("retry: decision %s, generation %d", again.Decision, again.Generation)
			}
			seen, err := gateway.LookupScope(ctx, &pb.ScopeLookup{Subject: &pb.Subject{Tenant: tenant, Principal: principal},
				Operation: operation, ApiRevision: revision, IdempotencyKey: args.Key})
			if err != nil {
				return "", err
			}
			if seen.Record.Generation != 2 {
				return "", fmt.Errorf("lookup generation %d", seen.Record.Generation)
			}
			return "RESERVED -> Claim(OWNER) EXECUTING -> Release RESERVED -> retry ACCEPTED at generation 2", nil
		}},
	}

	for _, c := range checks {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		detail, err := c.run(ctx)
		cancel()
		if err != nil {
			fmt.Printf("FAIL %s: %v\n", c.name, err)
			os.Exit(1)
		}
		fmt.Printf("PASS %s: %s\n", c.name, detail)
	}
	fmt.Printf("go: all %d checks passed\n", len(checks))
}
