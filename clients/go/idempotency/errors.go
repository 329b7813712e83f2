package idempotency

import (
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Domain is the domain of every google.rpc.ErrorInfo the coordinator sends.
const Domain = "idempotency.v1"

// Error is a refused call. Switch on Reason (the stable names of
// proto/idempotency/v1/errors.proto, e.g. "STALE_GENERATION"), never on Message.
type Error struct {
	// Code is the gRPC status code, e.g. codes.FailedPrecondition.
	Code codes.Code
	// Reason is ErrorInfo.reason, or "" when the refusal carries no ErrorInfo of
	// the domain (framework errors: malformed message, deadline, connection).
	Reason string
	// Domain is ErrorInfo.domain ("idempotency.v1" when Reason is set).
	Domain string
	// Message is the human-readable message.
	Message string
	// Metadata is ErrorInfo.metadata, e.g. {"current_generation": "1"}.
	Metadata map[string]string

	status *status.Status
}

func (e *Error) Error() string {
	if e.Reason == "" {
		return fmt.Sprintf("%s: %s", e.Code, e.Message)
	}
	return fmt.Sprintf("%s %s: %s", e.Code, e.Reason, e.Message)
}

// GRPCStatus returns the original status, so that status.FromError and
// status.Code keep working on an *Error.
func (e *Error) GRPCStatus() *status.Status { return e.status }

// FromError converts the error of a gRPC call: the status (decoded by grpc-go
// from the grpc-status-details-bin trailer) and its details, where the
// google.rpc.ErrorInfo of domain "idempotency.v1" gives Reason and Metadata.
// It returns nil for nil, and an *Error with codes.Unknown for an error that
// carries no gRPC status.
func FromError(err error) *Error {
	if err == nil {
		return nil
	}
	var already *Error
	if errors.As(err, &already) {
		return already
	}
	st, _ := status.FromError(err) // codes.Unknown with err's text when it is not a status
	out := &Error{Code: st.Code(), Message: st.Message(), Metadata: map[string]string{}, status: st}
	for _, detail := range st.Details() {
		info, ok := detail.(*errdetails.ErrorInfo)
		if !ok {
			continue
		}
		if info.GetDomain() == Domain || out.Reason == "" {
			out.Reason, out.Domain = info.GetReason(), info.GetDomain()
			out.Metadata = map[string]string{}
			for k, v := range info.GetMetadata() {
				out.Metadata[k] = v
			}
		}
	}
	return out
}

// ReasonOf is the refusal reason of err ("" when it has none).
func ReasonOf(err error) string {
	if e := FromError(err); e != nil {
		return e.Reason
	}
	return ""
}
