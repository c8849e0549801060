package httpsrc

import (
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// backoff is capped exponential backoff with jitter: attempt n waits a
// random time in [d/2, d], d = min(base * 2^(n-1), max).
func backoff(base, max time.Duration, attempt int) time.Duration {
	d := base
	for i := 1; i < attempt && d < max; i++ {
		d *= 2
	}
	d = min(d, max)
	return d/2 + time.Duration(mrand.Int64N(int64(d/2)+1))
}

// retryAfter parses a Retry-After value, delay-seconds or an HTTP-date
// (RFC 9110 §10.2.3), against the Source's clock. told is false when the
// header is absent or unreadable; a date in the past means no wait.
func (s *Source) retryAfter(v string) (wait time.Duration, told bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		if n > int64(365*24*time.Hour/time.Second) {
			n = int64(365 * 24 * time.Hour / time.Second)
		}
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(s.cfg.Clock.Now()), 0), true
}
