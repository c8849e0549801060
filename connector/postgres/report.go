package postgres

import (
	"errors"
	"fmt"
	"strings"
)

// Severity grades a preflight finding.
type Severity uint8

const (
	// OK: the requirement is met.
	OK Severity = iota
	// Warn: tidemark works, but an operator should act (a missing index,
	// missing privileges for horizon mode).
	Warn
	// Fail: tidemark refuses to run until the operator fixes it.
	Fail
)

func (s Severity) String() string {
	switch s {
	case OK:
		return "ok"
	case Warn:
		return "warn"
	case Fail:
		return "fail"
	}
	return fmt.Sprintf("Severity(%d)", uint8(s))
}

// Finding is one preflight result.
type Finding struct {
	Severity Severity
	// Check names what was checked: "table", "id", "updated_at",
	// "deleted_at", "columns", "filter", "row security", "index",
	// "encoding", "horizon".
	Check string
	// Message says what was found and, for Warn and Fail, what to do.
	Message string
}

func (f Finding) String() string { return f.Severity.String() + " " + f.Check + ": " + f.Message }

// Report is the result of a preflight (docs/design.md, "Source table requirements").
type Report struct {
	Findings []Finding
}

func (r *Report) add(s Severity, check, format string, args ...any) {
	r.Findings = append(r.Findings, Finding{Severity: s, Check: check, Message: fmt.Sprintf(format, args...)})
}
func (r *Report) ok(check, format string, args ...any)   { r.add(OK, check, format, args...) }
func (r *Report) warn(check, format string, args ...any) { r.add(Warn, check, format, args...) }
func (r *Report) fail(check, format string, args ...any) { r.add(Fail, check, format, args...) }

// Err returns nil when no finding is Fail, else an error wrapping
// ErrBadConfig (exit code 2) that lists every failure.
func (r Report) Err() error {
	var errs []error
	for _, f := range r.Findings {
		if f.Severity == Fail {
			errs = append(errs, errors.New(f.Check+": "+f.Message))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrBadConfig, errors.Join(errs...))
}

// String renders one finding per line.
func (r Report) String() string {
	var b strings.Builder
	for _, f := range r.Findings {
		b.WriteString(f.String())
		b.WriteByte('\n')
	}
	return b.String()
}
