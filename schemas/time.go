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
	var buf [32]byte
	return string(AppendTime(buf[:0], t))
}

// AppendTime appends t in TimeLayout to b. It is on the hot path (one
// header per record), so years 0..9999 are formatted by hand; others fall
// back to time.Format.
func AppendTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.Truncate(time.Microsecond).AppendFormat(b, TimeLayout)
	}
	hour, min, sec := t.Clock()
	us := t.Nanosecond() / 1000
	b = append(b, byte('0'+year/1000), byte('0'+year/100%10), byte('0'+year/10%10), byte('0'+year%10), '-',
		byte('0'+int(month)/10), byte('0'+int(month)%10), '-', byte('0'+day/10), byte('0'+day%10), 'T',
		byte('0'+hour/10), byte('0'+hour%10), ':', byte('0'+min/10), byte('0'+min%10), ':',
		byte('0'+sec/10), byte('0'+sec%10), '.')
	return append(b, byte('0'+us/100000), byte('0'+us/10000%10), byte('0'+us/1000%10),
		byte('0'+us/100%10), byte('0'+us/10%10), byte('0'+us%10), 'Z')
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
