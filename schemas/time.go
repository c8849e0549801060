package schemas

import (
	"fmt"
	"time"
)

// TimeLayout is the one timestamp layout tidemark writes: RFC 3339, UTC,
// exactly six fractional digits, "Z" suffix. Microseconds are PostgreSQL's
// resolution, so every round trip through a cursor, checkpoint or header is
// exact.
const TimeLayout = "2006-01-02T15:04:05.000000Z"

// FormatTime formats t in TimeLayout (UTC, microseconds).
func FormatTime(t time.Time) string {
	return t.UTC().Truncate(time.Microsecond).Format(TimeLayout)
}

// AppendTime appends t in TimeLayout to b.
func AppendTime(b []byte, t time.Time) []byte {
	return t.UTC().Truncate(time.Microsecond).AppendFormat(b, TimeLayout)
}

// ParseTime parses a timestamp written by FormatTime. It also accepts any
// RFC 3339 timestamp, and refuses sub-microsecond precision rather than
// silently truncating it.
func ParseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("timestamp %q is not RFC 3339: %w", s, err)
	}
	if t.Nanosecond()%1000 != 0 {
		return time.Time{}, fmt.Errorf("timestamp %q has sub-microsecond digits; tidemark keeps microseconds exactly and will not round", s)
	}
	return t.UTC(), nil
}

// Micros returns t as microseconds since the Unix epoch.
func Micros(t time.Time) int64 { return t.UnixMicro() }

// FromMicros is the inverse of Micros.
func FromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }
