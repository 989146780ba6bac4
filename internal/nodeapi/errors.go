package nodeapi

import (
	"errors"

	"connectrpc.com/connect"
)

// Error classes of the node API. Every error a Node returns (Remote from
// across the network, the in-process node through NewError) matches the
// class of its Connect code with errors.Is, so that the control plane
// classifies with sentinels and never reads transport codes; the codes
// are chosen at the edge (NewError on the node's side, the handler for a
// Node that returns bare sentinels, such as a test's fake).
var (
	// ErrNotFound: no such sandbox, snapshot, template or volume.
	ErrNotFound = errors.New("not found")
	// ErrExists: it exists already (a sandbox id, a volume).
	ErrExists = errors.New("already exists")
	// ErrInvalid: the request is malformed.
	ErrInvalid = errors.New("invalid argument")
	// ErrResourceExhausted: the node has no room for it now.
	ErrResourceExhausted = errors.New("resource exhausted")
	// ErrFailedPrecondition: the sandbox is not in a state that allows it.
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrUnimplemented: the node cannot do it (its runtime lacks it).
	ErrUnimplemented = errors.New("unimplemented")
	// ErrUnavailable: the node cannot be reached or is not ready.
	ErrUnavailable = errors.New("unavailable")
	// ErrCanceled: the call was cancelled or ran out of time.
	ErrCanceled = errors.New("canceled")
)

// classes pairs each Connect code with its class; codes not listed have
// none (errors.Is matches no class).
var classes = []struct {
	code  connect.Code
	class error
}{
	{connect.CodeNotFound, ErrNotFound},
	{connect.CodeAlreadyExists, ErrExists},
	{connect.CodeInvalidArgument, ErrInvalid},
	{connect.CodeResourceExhausted, ErrResourceExhausted},
	{connect.CodeFailedPrecondition, ErrFailedPrecondition},
	{connect.CodeUnimplemented, ErrUnimplemented},
	{connect.CodeUnavailable, ErrUnavailable},
	{connect.CodeCanceled, ErrCanceled},
	{connect.CodeDeadlineExceeded, ErrCanceled},
}

func classOf(code connect.Code) error {
	for _, c := range classes {
		if c.code == code {
			return c.class
		}
	}
	return nil
}

func codeOf(class error) (connect.Code, bool) {
	for _, c := range classes {
		if errors.Is(class, c.class) {
			return c.code, true
		}
	}
	return 0, false
}

// classed is a Connect error that errors.Is matches against its code's
// class; errors.As still finds the *connect.Error inside, so the handler
// sends its code.
type classed struct{ err error }

func (e *classed) Error() string { return e.err.Error() }
func (e *classed) Unwrap() error { return e.err }

// Is makes the error match its code's class.
func (e *classed) Is(target error) bool {
	class := classOf(connect.CodeOf(e.err))
	return class != nil && class == target
}

// NewError is the node API error with code for err: what the node's side
// returns, in-process and (through the handler) across the network.
func NewError(code connect.Code, err error) error {
	return &classed{err: connect.NewError(code, err)}
}

// classify gives an error off the wire the class of its code.
func classify(err error) error {
	var ce *connect.Error
	if err == nil || !errors.As(err, &ce) {
		return err
	}
	var c *classed
	if errors.As(err, &c) {
		return err
	}
	return &classed{err: err}
}

// toWire gives an error a Connect code for the wire: its own, or the one
// of the class it wraps (a Node that returns fmt.Errorf("%w: ...",
// ErrNotFound)), or none (Connect's CodeUnknown).
func toWire(err error) error {
	var ce *connect.Error
	if err == nil || errors.As(err, &ce) {
		return err
	}
	if code, ok := codeOf(err); ok {
		return connect.NewError(code, err)
	}
	return err
}

// fromWire classifies the error of a client call.
func fromWire[T any](v T, err error) (T, error) { return v, classify(err) }

// served gives the error of a Node's answer its code for the wire.
func served[T any](v T, err error) (T, error) { return v, toWire(err) }
