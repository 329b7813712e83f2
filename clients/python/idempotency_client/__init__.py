"""A small Python client of the idempotency coordinator (``idempotency.v1.CoordinatorService``).

It wraps the stub that ``clients/generate.sh`` generates from ``proto/`` with Debian's
``protoc`` and ``grpc_python_plugin`` (``idempotency_client/_generated``, committed and installed
with the package), sends the caller's bearer token with every call, applies a deadline to every
call, and turns refusals into :class:`CoordinatorError`, whose ``reason`` is read from the
``google.rpc.ErrorInfo`` detail (domain ``idempotency.v1``) of the ``grpc-status-details-bin``
trailer. Every RPC returns a :class:`Result`: the response's fields, with every enum field as a
member of :class:`Decision`, :class:`RecordState`, :class:`EffectStatus`, :class:`Outcome` or
:class:`ClaimMode`, a ``str`` that is its short name (``r.state == "SUCCEEDED"``, and
``print(r.state)`` prints ``SUCCEEDED``). Needs only ``python3-grpcio`` and ``python3-protobuf``.

Example::

    from idempotency_client import CoordinatorClient, CoordinatorError

    with CoordinatorClient("127.0.0.1:7070", token) as client:
        r = client.reserve("acme", "alice", "payments.create", 1, key,
                           path="/v1/payments", body=b'{"amount":10}', claim=True)
        print(r.decision)  # ACCEPTED; REPLAY for a retry once it completed
        if r.decision == "ACCEPTED":
            try:
                a = client.record_effect_attempt("acme", r.operation_id, r.generation, "card.charge")
                handle = charge(idempotency_key=a.attempt.downstream_key)
                client.resolve_effect_attempt("acme", r.operation_id, r.generation,
                                              a.attempt.attempt_number, "CONFIRMED", handle)
                done = client.complete("acme", r.operation_id, r.generation, "SUCCEEDED",
                                       status_code=201, body=b'{"id":"p_1"}')
                print(done.state)  # SUCCEEDED
            except CoordinatorError as e:
                if e.reason == "STALE_GENERATION":
                    ...  # someone took over: stop, do not retry the write
                raise
        seen = client.lookup("acme", "alice", operation_id=r.operation_id)
        print(seen.record.state, seen.record.effect_attempts[0].status)  # SUCCEEDED CONFIRMED
"""

from __future__ import annotations

import enum
import re
from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple, Union

import grpc  # python3-grpcio
from google.protobuf import duration_pb2  # python3-protobuf
from google.protobuf.descriptor import FieldDescriptor

try:
    from ._generated.google.rpc import error_details_pb2, status_pb2
    from ._generated.idempotency.v1 import coordinator_pb2, coordinator_pb2_grpc, types_pb2
except ImportError as exc:  # pragma: no cover - a setup problem, reported plainly
    raise ImportError(
        f"the generated code is missing ({exc}): it is committed with the package in "
        "idempotency_client/_generated; restore it, or regenerate it with clients/generate.sh --no-build"
    ) from exc

__all__ = [
    "ClaimMode",
    "CoordinatorClient",
    "CoordinatorError",
    "Decision",
    "EffectStatus",
    "ERROR_DOMAIN",
    "Outcome",
    "ProtoEnum",
    "RecordState",
    "Result",
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


class ProtoEnum(str, enum.Enum):
    """A value of one of the contract's enums, named as the README and the docs name it.

    A member is a ``str``, its short name: the proto value's name without the enum's prefix
    (``RecordState.SUCCEEDED`` for ``RECORD_STATE_SUCCEEDED``). It prints, formats and compares
    as that name (``state == "SUCCEEDED"``); ``number`` is its number on the wire. The members
    are read from the generated descriptors, so they follow ``proto/`` as it is.
    """

    number: int

    def __new__(cls, name: str, number: int) -> "ProtoEnum":
        member = str.__new__(cls, name)
        member._value_ = name
        member.number = number
        return member

    __str__ = str.__str__
    __format__ = str.__format__

    def __repr__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    @classmethod
    def of(cls, value: Union[str, int]) -> "ProtoEnum":
        """The member for a member, a short name (``"OWNER"``), a full name
        (``"CLAIM_MODE_OWNER"``, any case) or a number; ``ValueError`` for anything else."""
        if isinstance(value, cls):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            for member in cls:
                if member.number == value:
                    return member
        elif isinstance(value, str):
            name = value.upper()
            member = cls.__members__.get(name[len(cls._prefix) :] if name.startswith(cls._prefix) else name)
            if member is not None:
                return member
        raise ValueError(f"{value!r} is not a {cls.__name__}: use one of {', '.join(cls.__members__)}")


def _proto_enum(enum_type) -> type:
    """The ProtoEnum of a generated enum; its values share the prefix buf's lint requires
    (``RecordState`` -> ``RECORD_STATE_``)."""
    descriptor = enum_type.DESCRIPTOR
    prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", descriptor.name).upper() + "_"
    members = {}
    for value in descriptor.values:
        if not value.name.startswith(prefix):
            raise ImportError(f"{descriptor.full_name}.{value.name} does not start with {prefix}")
        short = value.name[len(prefix) :]
        members[short] = (short, value.number)
    cls = ProtoEnum(descriptor.name, members, module=__name__, qualname=descriptor.name)
    cls._prefix = prefix
    cls._full_name = descriptor.full_name
    cls.__doc__ = f"``{descriptor.full_name}`` by short name: {', '.join(members)}."
    return cls


Decision = _proto_enum(coordinator_pb2.Decision)
ClaimMode = _proto_enum(coordinator_pb2.ClaimMode)
RecordState = _proto_enum(types_pb2.RecordState)
EffectStatus = _proto_enum(types_pb2.EffectStatus)
Outcome = _proto_enum(types_pb2.Outcome)
_ENUMS = {names._full_name: names for names in (Decision, ClaimMode, RecordState, EffectStatus, Outcome)}


def _read_one(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_ENUM:
        names = _ENUMS.get(field.enum_type.full_name)
        if names is None:
            return value
        try:
            return names.of(value)
        except ValueError:  # a number this client's protos do not know (a newer server)
            return value
    if field.type == FieldDescriptor.TYPE_MESSAGE and not field.message_type.full_name.startswith("google.protobuf."):
        return Result(value)
    return value


def _read(field: FieldDescriptor, value: Any) -> Any:
    if field.label != FieldDescriptor.LABEL_REPEATED:
        return _read_one(field, value)
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        value_field = field.message_type.fields_by_name["value"]
        return {key: _read_one(value_field, item) for key, item in value.items()}
    return tuple(_read_one(field, item) for item in value)


class Result:
    """A response of the coordinator, or a message inside one, read-only.

    Its attributes are the generated message's fields, except that every enum field is its
    :class:`ProtoEnum` member (``r.decision == "ACCEPTED"``, ``print(r.state)`` prints
    ``SUCCEEDED``), every message field a :class:`Result` too (``google.protobuf`` types such
    as ``Duration`` and ``Timestamp`` stay as they are), repeated fields tuples and maps dicts.
    The message's methods (``HasField``, ``WhichOneof``, ``SerializeToString``, ...) work on it
    as they are; :meth:`to_proto` returns the generated message itself, with enums as numbers.
    """

    __slots__ = ("_message",)

    def __init__(self, message: Any) -> None:
        object.__setattr__(self, "_message", message)

    def to_proto(self) -> Any:
        """The generated message (``coordinator_pb2.*Response``, ``types_pb2.*``)."""
        return self._message

    def __getattr__(self, name: str) -> Any:
        message = object.__getattribute__(self, "_message")
        value = getattr(message, name)
        field = message.DESCRIPTOR.fields_by_name.get(name)
        return value if field is None else _read(field, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a {type(self).__name__} is read-only; to_proto() returns the message itself")

    def __dir__(self) -> list:
        return sorted(set(object.__dir__(self)) | set(self._message.DESCRIPTOR.fields_by_name))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Result):
            return self._message == other._message
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __str__(self) -> str:
        return str(self._message)  # protobuf's text format, which names enum values

    def __repr__(self) -> str:
        fields = ", ".join(f"{field.name}={getattr(self, field.name)!r}" for field, _ in self._message.ListFields())
        return f"{self._message.DESCRIPTOR.name}({fields})"


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

    Every method returns a :class:`Result` of the response (``coordinator_pb2.*Response``),
    whose enum fields are named members (``r.state == "SUCCEEDED"``), and raises
    :class:`CoordinatorError` when the coordinator refuses. Enum arguments accept a member, the
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

    def _call(self, method, request, timeout: Optional[float]) -> Result:
        try:
            response = method(request, timeout=self.timeout if timeout is None else timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            raise CoordinatorError.from_rpc_error(error) from None
        return Result(response)

    @staticmethod
    def _ref(tenant: str, operation_id: str) -> coordinator_pb2.OperationRef:
        return coordinator_pb2.OperationRef(tenant=tenant, operation_id=operation_id)

    # -- names of enum values ------------------------------------------------------------------
    # The results name their enum values themselves (``r.decision``, ``r.state``); these take
    # a number too, e.g. from a message of to_proto().

    @staticmethod
    def decision(response) -> ProtoEnum:
        """The decision of a Reserve response: ACCEPTED, REPLAY, IN_PROGRESS, PAYLOAD_CONFLICT, EXPIRED."""
        return Decision.of(response.decision)

    @staticmethod
    def state_name(state: Union[str, int]) -> ProtoEnum:
        """A record state by name: RESERVED, EXECUTING, SUCCEEDED, … UNKNOWN."""
        return RecordState.of(state)

    @staticmethod
    def effect_status_name(status: Union[str, int]) -> ProtoEnum:
        """An effect status by name: PENDING, CONFIRMED, NO_EFFECT, INDETERMINATE."""
        return EffectStatus.of(status)

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
    ) -> Result:
        """Reserve: decides what to do with one request (the acceptance point).

        The request is identified by its raw parts (``method``, ``path``, ``query``,
        ``media_type``, ``headers``, ``body``), or by a precomputed ``fingerprint`` when given.
        ``claim=True`` starts executing at once; ``lease`` is in seconds (``None``: the
        policy's default). Check the response's ``decision`` (``"ACCEPTED"``, ``"REPLAY"``, ...).
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
    ) -> Result:
        """Claim: takes ownership for execution; ``mode`` is OWNER, TAKEOVER or RECOVER."""
        request = coordinator_pb2.ClaimRequest(
            ref=self._ref(tenant, operation_id),
            mode=ClaimMode.of(mode).number,
            generation=generation,
            lease=_duration(lease),
            writer_epoch=writer_epoch,
        )
        return self._call(self._stub.Claim, request, timeout)

    def renew_lease(
        self, tenant: str, operation_id: str, generation: int, *, lease: Optional[float] = None, timeout: Optional[float] = None
    ) -> Result:
        """RenewLease: extends the lease of the generation you hold (``lease`` in seconds)."""
        request = coordinator_pb2.RenewLeaseRequest(
            ref=self._ref(tenant, operation_id), generation=generation, lease=_duration(lease)
        )
        return self._call(self._stub.RenewLease, request, timeout)

    def record_effect_attempt(
        self, tenant: str, operation_id: str, generation: int, effect: str, provider: str = "", *, timeout: Optional[float] = None
    ) -> Result:
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
    ) -> Result:
        """ResolveEffectAttempt: what the downstream call did (CONFIRMED, NO_EFFECT, INDETERMINATE)."""
        request = coordinator_pb2.ResolveEffectAttemptRequest(
            ref=self._ref(tenant, operation_id),
            generation=generation,
            attempt_number=attempt_number,
            status=EffectStatus.of(status).number,
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
    ) -> Result:
        """Complete: finishes the operation (SUCCEEDED, FAILED_FINAL, REJECTED) with the response
        to replay; returns its ``snapshot_digest``."""
        request = coordinator_pb2.CompleteRequest(
            ref=self._ref(tenant, operation_id),
            generation=generation,
            outcome=Outcome.of(outcome).number,
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
    ) -> Result:
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
    ) -> Result:
        """Lookup: reads an operation by ``operation_id``, or by its scope (``operation``,
        ``api_revision``, ``idempotency_key``), as the subject (``tenant``, ``principal``).

        ``principal`` is the end user the record was reserved for (the ``principal`` given to
        :meth:`reserve`): without the operator role a caller sees only that principal's records,
        and any other answers ``NOT_FOUND``. An operator may pass ``""`` with ``operation_id``.
        """
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
