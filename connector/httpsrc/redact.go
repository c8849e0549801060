package httpsrc

import (
	"net/url"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Redacted replaces a secret in printed text.
const Redacted = "REDACTED"

// IsSecretParam reports whether a URL query parameter (or a DSN keyword)
// name looks like it carries a secret: pass, pwd, secret, token, key,
// auth, sig or credential in any case. When in doubt it says yes.
func IsSecretParam(name string) bool {
	n := strings.ToLower(name)
	for _, s := range []string{"pass", "pwd", "secret", "token", "key", "auth", "sig", "credential"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// RedactURL returns s with the password of its user info (an http(s) URL's
// user name alone too: it is sent as basic auth, often an API key) and the values of
// secret-looking query parameters (IsSecretParam) replaced by REDACTED. A
// string whose '@' signs do not all belong to the user info (an unencoded
// '@', '/', '?' or '#' in a password moves it) is redacted conservatively:
// everything from the first ':' of the user info to the last '@'. It
// redacts too much rather than too little.
func RedactURL(s string) string {
	if u, err := url.Parse(s); err == nil {
		want := 0
		if u.User != nil {
			want = 1
		}
		if strings.Count(s, "@") == want {
			if _, ok := u.User.Password(); ok {
				u.User = url.UserPassword(u.User.Username(), Redacted)
			} else if u.User != nil && (u.Scheme == "http" || u.Scheme == "https") {
				// An HTTP client sends a user name alone as basic auth,
				// which is often an API key.
				u.User = url.User(Redacted)
			}
			q := u.Query()
			changed := false
			for k := range q {
				if IsSecretParam(k) {
					q[k] = []string{Redacted}
					changed = true
				}
			}
			if changed {
				u.RawQuery = q.Encode()
			}
			if u.Fragment != "" {
				// A fragment may carry parameters too (an OAuth token).
				u.Fragment = redactParams(u.Fragment)
				u.RawFragment = ""
			}
			return u.String()
		}
	}
	i := strings.Index(s, "://") + 3
	head, rest := s[:i], s[i:]
	// from is where parameters may start: after the redacted user info,
	// or anywhere when none was redacted. The query's '?' may be inside
	// what was redacted (an '@' in the query, an e-mail address say, ends
	// the user info there), so every parameter after it is looked at,
	// wherever it starts.
	from := 0
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		if colon := strings.IndexByte(rest[:at], ':'); colon >= 0 {
			rest = rest[:colon+1] + Redacted + rest[at:]
			from = colon + 1 + len(Redacted)
		}
	}
	return head + rest[:from] + redactParams(rest[from:])
}

// redactParams replaces the values of secret-looking parameters
// (IsSecretParam) in s, a query or any text whose parameters are separated
// by '?', '&' or '#'.
func redactParams(s string) string {
	var b strings.Builder
	for s != "" {
		end := strings.IndexAny(s, "?&#")
		seg, sep := s, ""
		if end >= 0 {
			seg, sep, s = s[:end], s[end:end+1], s[end+1:]
		} else {
			s = ""
		}
		if name, _, ok := strings.Cut(seg, "="); ok && IsSecretParam(name) {
			seg = name + "=" + Redacted
		}
		b.WriteString(seg)
		b.WriteString(sep)
	}
	return b.String()
}

// RedactCursor is a cursor as it may be printed: a link cursor (an
// absolute URL) with its secrets redacted (RedactURL); any cursor with
// control characters escaped (Escape). Opaque cursors are positions, not
// secrets, and print as they are.
func RedactCursor(c string) string {
	if u, err := url.Parse(c); err == nil && u.IsAbs() && u.Host != "" {
		c = RedactURL(c)
	}
	return Escape(c)
}

// showCursor quotes a cursor for a message: redacted, escaped, bounded.
func showCursor(c string) string {
	c = RedactCursor(c)
	if len(c) > 300 {
		c = c[:300] + "..."
	}
	return `"` + c + `"`
}

// Escape makes text that came from elsewhere (an upstream's error body, a
// cursor) safe to print on a terminal or in a log line: control characters
// (among them ESC, which starts terminal escapes, and CR and LF, which could
// forge a log line), invalid UTF-8 and other non-printable runes become Go
// escapes such as \x1b, \r, \n, \u2028. Printable text, backslashes and
// quotes are left alone.
func Escape(s string) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) && r != ' ' {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[i])|0x100, 16)[1:])
		case unicode.IsPrint(r) || r == ' ':
			b.WriteString(s[i : i+n])
		default:
			q := strconv.QuoteRune(r) // '\x1b', '\n', '\u2028'
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}
