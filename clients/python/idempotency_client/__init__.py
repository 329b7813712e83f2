"""A small Python client of the idempotency coordinator (``idempotency.v1.CoordinatorService``).

It wraps the stub that ``clients/generate.sh`` generates from ``proto/`` with Debian's
``protoc`` and ``grpc_python_plugin`` (``idempotency_client/_generated``, committed and installed
with the package), sends the caller's bearer token with every call, applies a deadline to every
call, and turns refusals into :class:`CoordinatorError`, whose ``reason`` is read from the
``google.rpc.ErrorInfo`` detail (domain ``idempotency.v1``) of the ``grpc-status-details-bin``
trailer. Needs only ``python3-grpcio`` and ``python3-protobuf``.

Example::

    from idempotency_client import CoordinatorClient, CoordinatorError

    with CoordinatorClient("127.0.0.1:7070", token) as client:
        r = client.reserve("acme", "alice", "payments.create", 1, key,
                           path="/v1/payments", body=b'{"amount":10}', claim=True)
        if client.decision(r) == "ACCEPTED":
            try:
                a = client.record_effect_attempt("acme", r.operation_id, r.generation, "card.charge")
                # ... call the provider with a.attempt.downstream_key ...
                client.resolve_effect_attempt("acme", r.operation_id, r.generation,
                                              a.attempt.attempt_number, "CONFIRMED", "ch_1")
                client.complete("acme", r.operation_id, r.generation, "SUCCEEDED",
                                status_code=201, body=b'{"id":"p_1"}')
            except CoordinatorError as e:
                if e.reason == "STALE_GENERATION":
                    ...  # someone took over: stop, do not retry the write
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional, Sequence, Tuple, Union

import grpc  # python3-grpcio
from google.protobuf import duration_pb2  # python3-protobuf

try:
    from ._generated.google.rpc import error_details_pb2, status_pb2
    from ._generated.idempotency.v1 import coordinator_pb2, coordinator_pb2_grpc, types_pb2
except ImportError as exc:  # pragma: no cover - a setup problem, reported plainly
    raise ImportError(
        f"the generated code is missing ({exc}): it is committed with the package in "
        "idempotency_client/_generated; restore it, or regenerate it with clients/generate.sh --no-build"
    ) from exc

__all__ = [
    "CoordinatorClient",
    "CoordinatorError",
    "ERROR_DOMAIN",
    "coordinator_pb2",
    "types_pb2",
]

#: The ``domain`` of every ``google.rpc.ErrorInfo`` the coordinator sends.
ERROR_DOMAIN = "idempotency.v1"
#: The trailer that carries the binary ``google.rpc.Status`` of a refused call.
STATUS_DETAILS_KEY = "grpc-status-details-bin"
#: The deadline of every call, in seconds, unless the call names another.
DEFAULT_TIMEOUT = 10.0

Header = Union[Tuple[str, str], "types_pb2.Header"]


class CoordinatorError(Exception):
    """A refused call.

    Attributes:
        code: the ``grpc.StatusCode`` (e.g. ``FAILED_PRECONDITION``).
        reason: the stable reason from the ``ErrorInfo`` detail (e.g. ``"STALE_GENERATION"``;
            the list is ``proto/idempotency/v1/errors.proto``), or ``None`` when the refusal
            carries none (framework errors: malformed message, deadline, connection).
        message: the human-readable message (never switch on it).
        metadata: the ``ErrorInfo`` metadata (e.g. ``{"current_generation": "1"}``).
        domain: the ``ErrorInfo`` domain (``"idempotency.v1"`` when ``reason`` is set).
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        reason: Optional[str],
        message: str,
        metadata: Optional[Mapping[str, str]] = None,
        domain: Optional[str] = None,
    ) -> None:
        super().__init__(f"{code.name}{f' {reason}' if reason else ''}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.metadata = dict(metadata or {})
        self.domain = domain

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "CoordinatorError":
        """Builds the error from a failed call, decoding the status details trailer:
        ``grpc-status-details-bin`` -> ``google.rpc.Status`` -> ``details[]`` (``Any``) ->
        the ``google.rpc.ErrorInfo`` whose domain is ``idempotency.v1``."""
        code = error.code() if callable(getattr(error, "code", None)) else grpc.StatusCode.UNKNOWN
        message = (error.details() if callable(getattr(error, "details", None)) else None) or ""
        reason = domain = None
        metadata: dict = {}
        trailers = error.trailing_metadata() if callable(getattr(error, "trailing_metadata", None)) else None
        for key, value in trailers or ():
            if key != STATUS_DETAILS_KEY:
                continue
            status = status_pb2.Status.FromString(value)
            message = status.message or message
            for detail in status.details:
                if not detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    continue
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                if info.domain == ERROR_DOMAIN or reason is None:
                    reason, domain, metadata = info.reason, info.domain, dict(info.metadata)
        return cls(code, reason, message, metadata, domain)


def _enum(enum_type, prefix: str, value: Union[str, int]) -> int:
    """An enum value from its int, its full name (``CLAIM_MODE_OWNER``) or its short name (``OWNER``)."""
    if isinstance(value, int):
        return value
    name = value.upper()
    return enum_type.Value(name if name.startswith(prefix) else prefix + name)


def _short(enum_type, prefix: str, value: int) -> str:
    name = enum_type.Name(value)
    return name[len(prefix):] if name.startswith(prefix) else name


def _duration(seconds: Optional[float]) -> Optional[duration_pb2.Duration]:
    if seconds is None:
        return None
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(round(seconds * 1e9)))
    return d


def _headers(headers: Iterable[Header]) -> list:
    return [h if isinstance(h, types_pb2.Header) else types_pb2.Header(name=h[0], value=h[1]) for h in headers]


class CoordinatorClient:
    """A client of ``idempotency.v1.CoordinatorService`` over gRPC (HTTP/2 cleartext).

    Args:
        target: ``host:port`` of the coordinator, e.g. ``"127.0.0.1:7070"``.
        token: the caller's bearer token, sent as ``authorization: Bearer <token>``;
            ``None`` sends none (every RPC is then refused ``UNAUTHENTICATED``).
        timeout: the deadline of every call in seconds (a call may pass its own ``timeout``).
        channel: an existing channel to use instead of an insecure one to ``target``
            (e.g. ``grpc.secure_channel(...)``); it is not closed by :meth:`close`.

    Every method returns the generated response message (``coordinator_pb2.*Response``) and
    raises :class:`CoordinatorError` when the coordinator refuses. Enum arguments accept the
    short name (``"OWNER"``, ``"CONFIRMED"``, ``"SUCCEEDED"``), the full name or the number.
    """

    def __init__(
        self,
        target: str,
        token: Optional[str],
        timeout: float = DEFAULT_TIMEOUT,
        channel: Optional[grpc.Channel] = None,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self._own_channel = channel is None
        self._channel = channel if channel is not None else grpc.insecure_channel(target)
        self._stub = coordinator_pb2_grpc.CoordinatorServiceStub(self._channel)
        self._metadata: Tuple[Tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()

    # -- plumbing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the channel (if this client opened it)."""
        if self._own_channel:
            self._channel.close()

    def __enter__(self) -> "CoordinatorClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request, timeout: Optional[float]):
        try:
            return method(request, timeout=self.timeout if timeout is None else timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            raise CoordinatorError.from_rpc_error(error) from None

    @staticmethod
    def _ref(tenant: str, operation_id: str) -> coordinator_pb2.OperationRef:
        return coordinator_pb2.OperationRef(tenant=tenant, operation_id=operation_id)

    # -- names of enum values ------------------------------------------------------------------

    @staticmethod
    def decision(response: coordinator_pb2.ReserveResponse) -> str:
        """The short name of a Reserve decision: ACCEPTED, REPLAY, IN_PROGRESS, PAYLOAD_CONFLICT, EXPIRED."""
        return _short(coordinator_pb2.Decision, "DECISION_", response.decision)

    @staticmethod
    def state_name(state: int) -> str:
        """The short name of a record state: RESERVED, EXECUTING, SUCCEEDED, … UNKNOWN."""
        return _short(types_pb2.RecordState, "RECORD_STATE_", state)

    @staticmethod
    def effect_status_name(status: int) -> str:
        """The short name of an effect status: PENDING, CONFIRMED, NO_EFFECT, INDETERMINATE."""
        return _short(types_pb2.EffectStatus, "EFFECT_STATUS_", status)

    # -- RPCs ----------------------------------------------------------------------------------

    def reserve(
        self,
        tenant: str,
        principal: str,
        operation: str,
        api_revision: int,
        idempotency_key: str,
        *,
        method: str = "POST",
        path: str = "/",
        query: str = "",
        media_type: str = "application/json",
        headers: Sequence[Header] = (),
        body: bytes = b"",
        fingerprint: Optional[types_pb2.PrecomputedFingerprint] = None,
        claim: bool = False,
        lease: Optional[float] = None,
        writer_epoch: int = 0,
        timeout: Optional[float] = None,
    ) -> coordinator_pb2.ReserveResponse:
        """Reserve: decides what to do with one request (the acceptance point).

        The request is identified by its raw parts (``method``, ``path``, ``query``,
        ``media_type``, ``headers``, ``body``), or by a precomputed ``fingerprint`` when given.
        ``claim=True`` starts executing at once; ``lease`` is in seconds (``None``: the
        policy's default). Check :meth:`decision` on the response.
        """
        request = coordinator_pb2.ReserveRequest(
            subject=types_pb2.Subject(tenant=tenant, principal=principal),
            operation=operation,
            api_revision=api_revision,
            idempotency_key=idempotency_key,
            claim=claim,
            lease=_duration(lease),
            writer_epoch=writer_epoch,
        )
        if fingerprint is not None:
            request.fingerprint.CopyFrom(fingerprint)
        else:
            request.parts.CopyFrom(
                types_pb2.HttpRequestParts(
                    method=method, path=path, query=query, media_type=media_type, headers=_headers(headers), body=body
                )
            )
        return self._call(self._stub.Reserve, request, timeout)

    def claim(
        self,
        tenant: str,
        operation_id: str,
        generation: int,
        mode: Union[str, int] = "OWNER",
        *,
        lease: Optional[float] = None,
        writer_epoch: int = 0,
        timeout: Optional[float] = None,
    ) -> coordinator_pb2.ClaimResponse:
        """Claim: takes ownership for execution; ``mode`` is OWNER, TAKEOVER or RECOVER."""
        request = coordinator_pb2.ClaimRequest(
            ref=self._ref(tenant, operation_id),
            mode=_enum(coordinator_pb2.ClaimMode, "CLAIM_MODE_", mode),
            generation=generation,
            lease=_duration(lease),
            writer_epoch=writer_epoch,
        )
        return self._call(self._stub.Claim, request, timeout)

    def renew_lease(
        self, tenant: str, operation_id: str, generation: int, *, lease: Optional[float] = None, timeout: Optional[float] = None
    ) -> coordinator_pb2.RenewLeaseResponse:
        """RenewLease: extends the lease of the generation you hold (``lease`` in seconds)."""
        request = coordinator_pb2.RenewLeaseRequest(
            ref=self._ref(tenant, operation_id), generation=generation, lease=_duration(lease)
        )
        return self._call(self._stub.RenewLease, request, timeout)

    def record_effect_attempt(
        self, tenant: str, operation_id: str, generation: int, effect: str, provider: str = "", *, timeout: Optional[float] = None
    ) -> coordinator_pb2.RecordEffectAttemptResponse:
        """RecordEffectAttempt: registers a downstream call before making it; send
        ``response.attempt.downstream_key`` downstream."""
        request = coordinator_pb2.RecordEffectAttemptRequest(
            ref=self._ref(tenant, operation_id), generation=generation, effect=effect, provider=provider
        )
        return self._call(self._stub.RecordEffectAttempt, request, timeout)

    def resolve_effect_attempt(
        self,
        tenant: str,
        operation_id: str,
        generation: int,
        attempt_number: int,
        status: Union[str, int],
        provider_handle: str = "",
        *,
        timeout: Optional[float] = None,
    ) -> coordinator_pb2.ResolveEffectAttemptResponse:
        """ResolveEffectAttempt: what the downstream call did (CONFIRMED, NO_EFFECT, INDETERMINATE)."""
        request = coordinator_pb2.ResolveEffectAttemptRequest(
            ref=self._ref(tenant, operation_id),
            generation=generation,
            attempt_number=attempt_number,
            status=_enum(types_pb2.EffectStatus, "EFFECT_STATUS_", status),
            provider_handle=provider_handle,
        )
        return self._call(self._stub.ResolveEffectAttempt, request, timeout)

    def complete(
        self,
        tenant: str,
        operation_id: str,
        generation: int,
        outcome: Union[str, int],
        *,
        status_code: int,
        body: bytes = b"",
        media_type: str = "application/json",
        location: str = "",
        business_version: str = "",
        headers: Sequence[Header] = (),
        timeout: Optional[float] = None,
    ) -> coordinator_pb2.CompleteResponse:
        """Complete: finishes the operation (SUCCEEDED, FAILED_FINAL, REJECTED) with the response
        to replay; returns its ``snapshot_digest``."""
        request = coordinator_pb2.CompleteRequest(
            ref=self._ref(tenant, operation_id),
            generation=generation,
            outcome=_enum(types_pb2.Outcome, "OUTCOME_", outcome),
            snapshot=types_pb2.ResponseSnapshot(
                status_code=status_code,
                media_type=media_type,
                location=location,
                business_version=business_version,
                headers=_headers(headers),
                body=body,
            ),
        )
        return self._call(self._stub.Complete, request, timeout)

    def release(
        self, tenant: str, operation_id: str, generation: int, *, timeout: Optional[float] = None
    ) -> coordinator_pb2.ReleaseResponse:
        """Release: hands a reservation back without any effect."""
        request = coordinator_pb2.ReleaseRequest(ref=self._ref(tenant, operation_id), generation=generation)
        return self._call(self._stub.Release, request, timeout)

    def lookup(
        self,
        tenant: str,
        principal: str,
        *,
        operation_id: Optional[str] = None,
        operation: Optional[str] = None,
        api_revision: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> coordinator_pb2.LookupResponse:
        """Lookup: reads an operation by ``operation_id``, or by its scope (``operation``,
        ``api_revision``, ``idempotency_key``), as the subject (tenant, principal)."""
        subject = types_pb2.Subject(tenant=tenant, principal=principal)
        if operation_id is not None:
            request = coordinator_pb2.LookupRequest(ref=self._ref(tenant, operation_id), subject=subject)
        else:
            if operation is None or api_revision is None or idempotency_key is None:
                raise ValueError("lookup needs operation_id, or operation, api_revision and idempotency_key")
            request = coordinator_pb2.LookupRequest(
                scope=coordinator_pb2.ScopeLookup(
                    subject=subject, operation=operation, api_revision=api_revision, idempotency_key=idempotency_key
                ),
                subject=subject,
            )
        return self._call(self._stub.Lookup, request, timeout)
