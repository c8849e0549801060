package connector

import (
	"errors"
	"fmt"
)

// ErrFenced is wrapped by a Publisher when another instance with the same
// transactional id has taken over. The fenced instance must stop at once.
var ErrFenced = errors.New("fenced by another instance with the same connector name")

// ErrPermanent marks failures that a retry cannot fix (authorization,
// a bad row type, a missing table). Wrap it to stop without retrying.
var ErrPermanent = errors.New("permanent failure")

// ErrInitialLoadOpen is returned by a sweep asked for while the initial
// load is not finished (with ErrPermanent): it would publish the rows the
// load has not reached, which the load then publishes again.
var ErrInitialLoadOpen = errors.New("the initial load is not finished")

// StopError is a safety stop: the connector cannot continue without an
// operator decision (docs/design.md, "Safety stops"). It never guesses.
type StopError struct {
	// Reason says what happened.
	Reason string
	// Hint says what the operator can do.
	Hint string
	// Err is the underlying error, if any.
	Err error
	// Unmarked: the stop is about what the checkpoint holds, so nothing is
	// written into it (the next run meets the same and stops again). A
	// source's other stops are committed into the checkpoint as a needed
	// decision. A newer release's position in a checkpoint must not be
	// marked by an older member of a group during a rolling upgrade.
	Unmarked bool
}

func (e *StopError) Error() string {
	s := "safety stop: " + e.Reason
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	if e.Hint != "" {
		s += "\n  what to do: " + e.Hint
	}
	return s
}

func (e *StopError) Unwrap() error { return e.Err }

// Stopf returns a *StopError.
func Stopf(hint string, format string, args ...any) *StopError {
	return &StopError{Reason: fmt.Sprintf(format, args...), Hint: hint}
}

// Fatal reports whether err must not be retried: fencing, safety stops and
// permanent failures.
func Fatal(err error) bool {
	var stop *StopError
	return errors.Is(err, ErrFenced) || errors.Is(err, ErrPermanent) || errors.As(err, &stop)
}
