#!/usr/bin/python3
"""The full life cycle of one operation against a running coordinator, with the Python client.

Environment:
    IDEM_TARGET          host:port of the coordinator's gRPC port, e.g. 127.0.0.1:7070
    IDEM_GATEWAY_TOKEN   a token with the gateway role for tenant IDEM_TENANT and operation
                         IDEM_OPERATION
    IDEM_WORKER_TOKEN    a token with the worker role for the same tenant and operation
    IDEM_TENANT          default "acme"
    IDEM_PRINCIPAL       default "py-client"
    IDEM_OPERATION       default "payments.create" (raw fingerprint mode), IDEM_API_REVISION 1

Prints one line per check (``PASS <check>: …`` or ``FAIL <check>: …``) and exits non-zero at
the first failure, after a first line naming the ``idempotency_client`` it imported. Run it
with the Python of a virtual environment the package is installed in (clients/README.md), or
from this folder with Debian's interpreter after clients/generate.sh:
/usr/bin/python3 test_lifecycle.py (the script's folder holds the package's source).
"""

import json
import os
import sys
import uuid

import grpc

import idempotency_client
from idempotency_client import CoordinatorClient, CoordinatorError, RecordState


class CheckFailed(Exception):
    pass


def expect(condition, what):
    if not condition:
        raise CheckFailed(what)


def expect_refusal(call, code, reason):
    try:
        response = call()
    except CoordinatorError as error:
        expect(error.code == code, f"code {error.code.name}, expected {code.name} ({error})")
        expect(error.reason == reason, f"reason {error.reason!r}, expected {reason!r} ({error})")
        expect(error.domain == "idempotency.v1", f"domain {error.domain!r}")
        return error
    raise CheckFailed(f"expected {code.name} {reason}, got a response: {response}")


def main() -> int:
    target = os.environ.get("IDEM_TARGET", "")
    gateway_token = os.environ.get("IDEM_GATEWAY_TOKEN", "")
    worker_token = os.environ.get("IDEM_WORKER_TOKEN", "")
    if not target or not gateway_token or not worker_token:
        print("set IDEM_TARGET, IDEM_GATEWAY_TOKEN and IDEM_WORKER_TOKEN", file=sys.stderr)
        return 2
    print(f"using idempotency_client from {os.path.dirname(idempotency_client.__file__)}", flush=True)
    tenant = os.environ.get("IDEM_TENANT", "acme")
    principal = os.environ.get("IDEM_PRINCIPAL", "py-client")
    operation = os.environ.get("IDEM_OPERATION", "payments.create")
    revision = int(os.environ.get("IDEM_API_REVISION", "1"))

    gateway = CoordinatorClient(target, gateway_token, timeout=10)
    worker = CoordinatorClient(target, worker_token, timeout=10)
    anonymous = CoordinatorClient(target, None, timeout=10)

    key = str(uuid.uuid4())
    payload = json.dumps({"amount": 10, "currency": "EUR"}).encode()
    other_payload = json.dumps({"amount": 100, "currency": "EUR"}).encode()
    snapshot_body = json.dumps({"id": "pay_" + uuid.uuid4().hex[:12], "amount": 10, "status": "captured"}).encode()
    state = {}

    def reserve(body, **kwargs):
        return gateway.reserve(tenant, principal, operation, revision, key, path="/v1/payments", body=body, **kwargs)

    def reserve_accepted():
        r = reserve(payload, claim=True)
        expect(r.decision == "ACCEPTED", f"decision {r.decision}")
        expect(r.generation == 1, f"generation {r.generation}")
        expect(str(r.state) == "EXECUTING", f"state {r.state}")
        expect(len(r.operation_id) == 36, f"operation id {r.operation_id!r}")
        # The result names its enum values, as the helper does for the generated message.
        expect(repr(r.decision) == "Decision.ACCEPTED", f"decision is {r.decision!r}")
        expect(gateway.decision(r.to_proto()) == r.decision and r.decision.number == r.to_proto().decision, "decision numbers")
        state["op"], state["gen"] = r.operation_id, r.generation
        return f"ACCEPTED, generation 1, EXECUTING, operation {r.operation_id}"

    def reserve_in_progress():
        r = reserve(payload)
        expect(r.decision == "IN_PROGRESS", f"decision {r.decision}")
        expect(r.operation_id == state["op"], "another operation id")
        expect(r.generation == 0, f"generation {r.generation} revealed")
        return f"IN_PROGRESS, retry after {r.retry_after.ToMilliseconds()} ms"

    def reserve_conflict():
        r = reserve(other_payload)
        expect(r.decision == "PAYLOAD_CONFLICT", f"decision {r.decision}")
        expect(r.operation_id == "", "the operation id was revealed")
        return "PAYLOAD_CONFLICT, nothing revealed"

    def record_effect():
        r = gateway.record_effect_attempt(tenant, state["op"], state["gen"], "card.charge", "card-provider")
        key43 = r.attempt.downstream_key
        expect(len(key43) == 43, f"downstream key {key43!r} has {len(key43)} characters")
        expect(str(r.attempt.status) == "PENDING", "not PENDING")
        expect(r.attempt.attempt_number == 1, f"attempt number {r.attempt.attempt_number}")
        state["attempt"] = r.attempt.attempt_number
        return f"attempt 1 PENDING, downstream key {key43} (43 chars)"

    def resolve_confirmed():
        r = gateway.resolve_effect_attempt(tenant, state["op"], state["gen"], state["attempt"], "CONFIRMED", "ch_123")
        expect(str(r.attempt.status) == "CONFIRMED", "not CONFIRMED")
        expect(r.attempt.provider_handle == "ch_123", "provider handle lost")
        return f"attempt {state['attempt']} CONFIRMED (provider handle ch_123)"

    def complete_succeeded():
        r = gateway.complete(
            tenant, state["op"], state["gen"], "SUCCEEDED",
            status_code=201, body=snapshot_body, location="/v1/payments/1",
        )
        expect(str(r.state) == "SUCCEEDED" and f"{r.state}" == "SUCCEEDED", f"state prints as {r.state}")
        expect(r.state == "SUCCEEDED" and r.state is RecordState.SUCCEEDED, f"state is {r.state!r}")
        expect(len(r.snapshot_digest) == 32, "digest is not 32 bytes")
        state["digest"] = r.snapshot_digest
        return f"SUCCEEDED, snapshot digest {r.snapshot_digest.hex()[:16]}…"

    def complete_repeat():
        r = gateway.complete(
            tenant, state["op"], state["gen"], "SUCCEEDED",
            status_code=201, body=snapshot_body, location="/v1/payments/1",
        )
        expect(r.snapshot_digest == state["digest"], "a repeated identical Complete changed the digest")
        return "identical Complete accepted again, same digest"

    def reserve_replay():
        r = reserve(payload)
        expect(r.decision == "REPLAY", f"decision {r.decision}")
        expect(r.snapshot.body == snapshot_body, "the replayed body differs")
        expect(r.snapshot.status_code == 201, f"status {r.snapshot.status_code}")
        expect(r.snapshot.digest == state["digest"], "the replayed digest differs")
        return "REPLAY, byte-identical body, same digest"

    def lookup_worker():
        r = worker.lookup(tenant, principal, operation_id=state["op"])
        rec = r.record
        expect(str(rec.state) == "SUCCEEDED", f"state {rec.state}")
        expect(len(rec.effect_attempts) == 1, f"{len(rec.effect_attempts)} attempts")
        expect(str(rec.effect_attempts[0].status) == "CONFIRMED", "attempt not CONFIRMED")
        expect(rec.snapshot.digest == state["digest"], "digest differs")
        return f"worker token: SUCCEEDED, 1 CONFIRMED effect attempt, same digest"

    def stale_generation():
        e = expect_refusal(
            lambda: gateway.complete(tenant, state["op"], 2, "SUCCEEDED", status_code=201, body=snapshot_body),
            grpc.StatusCode.FAILED_PRECONDITION, "STALE_GENERATION",
        )
        expect(e.metadata.get("current_generation") == "1", f"metadata {e.metadata}")
        return f"{e.code.name} {e.reason} (current_generation={e.metadata['current_generation']})"

    def invalid_key():
        e = expect_refusal(
            lambda: gateway.reserve(tenant, principal, operation, revision, "too-short", path="/v1/payments", body=payload),
            grpc.StatusCode.INVALID_ARGUMENT, "INVALID_KEY",
        )
        return f"{e.code.name} {e.reason}"

    def unauthenticated():
        e = expect_refusal(
            lambda: anonymous.reserve(tenant, principal, operation, revision, str(uuid.uuid4()), path="/v1/payments", body=payload),
            grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED",
        )
        return f"{e.code.name} {e.reason}"

    def permission_denied():
        e = expect_refusal(
            lambda: gateway.reserve("globex", principal, operation, revision, str(uuid.uuid4()), path="/v1/payments", body=payload),
            grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED",
        )
        return f"{e.code.name} {e.reason} (tenant globex)"

    def claim_release_takeover():
        key2 = str(uuid.uuid4())

        def reserve2():
            return gateway.reserve(tenant, principal, operation, revision, key2, path="/v1/payments", body=payload)

        r = reserve2()
        expect(r.decision == "ACCEPTED" and str(r.state) == "RESERVED", "not ACCEPTED/RESERVED")
        c = gateway.claim(tenant, r.operation_id, r.generation, "OWNER")
        expect(str(c.state) == "EXECUTING" and c.generation == 1, f"claim: {c}")
        rel = gateway.release(tenant, r.operation_id, c.generation)
        expect(str(rel.state) == "RESERVED" and rel.generation == 1, f"release: {rel}")
        again = reserve2()
        expect(again.decision == "ACCEPTED", f"decision {again.decision}")
        expect(again.generation == 2 and again.operation_id == r.operation_id, f"generation {again.generation}")
        seen = gateway.lookup(tenant, principal, operation=operation, api_revision=revision, idempotency_key=key2)
        expect(seen.record.generation == 2, f"lookup generation {seen.record.generation}")
        return "RESERVED -> Claim(OWNER) EXECUTING -> Release RESERVED -> retry ACCEPTED at generation 2"

    checks = [
        ("reserve-accepted", reserve_accepted),
        ("reserve-in-progress", reserve_in_progress),
        ("reserve-payload-conflict", reserve_conflict),
        ("record-effect-attempt", record_effect),
        ("resolve-confirmed", resolve_confirmed),
        ("complete-succeeded", complete_succeeded),
        ("complete-repeat", complete_repeat),
        ("reserve-replay", reserve_replay),
        ("lookup", lookup_worker),
        ("stale-generation", stale_generation),
        ("invalid-key", invalid_key),
        ("unauthenticated", unauthenticated),
        ("permission-denied", permission_denied),
        ("claim-release-takeover", claim_release_takeover),
    ]
    try:
        for name, check in checks:
            try:
                detail = check()
            except (CheckFailed, CoordinatorError) as error:
                print(f"FAIL {name}: {error}", flush=True)
                return 1
            print(f"PASS {name}: {detail}", flush=True)
    finally:
        for client in (gateway, worker, anonymous):
            client.close()
    print(f"python: all {len(checks)} checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
