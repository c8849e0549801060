package feed

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"net/http"
	"time"
	"unicode/utf8"
)

// CursorVersion is the cursor format this package writes and reads.
//
// Every version keeps the same envelope: the first byte is the version and
// the last 32 bytes are an HMAC-SHA256, under the server's key, of
// everything before them. Version 1's body, between the two, is
//
//	fingerprint  16 bytes  Fingerprint(collection, filter, tenant)
//	issued       8 bytes   big-endian microseconds since the Unix epoch
//	updated_at   8 bytes   big-endian microseconds since the Unix epoch
//	id           the rest  UTF-8 text
//
// and the whole is encoded with unpadded base64url. The position is the
// full sort key (updated_at, id) of the last item served, so the next page
// seeks strictly after it: a cursor whose anchor row was deleted still
// works.
const CursorVersion = 1

const (
	macLen   = sha256.Size
	fpLen    = 16
	v1Fixed  = 1 + fpLen + 8 + 8
	maxIDLen = 4096
)

// Stable error codes of the changes API (docs/http-source.md, The reference feed's contract). Clients match on
// these, never on messages.
const (
	CodeInvalidLimit   = "invalid_limit"   // 400: limit not an integer in 1..MaxLimit
	CodeInvalidSince   = "invalid_since"   // 400: since not an RFC 3339 timestamp with at most microseconds
	CodeInvalidCursor  = "invalid_cursor"  // 400: not a cursor of any version (bad encoding, too short, bad body)
	CodeCursorTampered = "cursor_tampered" // 400: not authenticated by this server's key
	CodeCursorForeign  = "cursor_foreign"  // 400: authentic, but for another collection, filter or tenant
	CodeCursorVersion  = "cursor_version"  // 400: authentic, but a format version this server does not speak
	CodeCursorExpired  = "cursor_expired"  // 410: older than the server's cursor TTL
	CodeUnauthorized   = "unauthorized"    // 401: missing or wrong bearer token
	CodeMethod         = "method_not_allowed"
	CodeInternal       = "internal"     // 500
	CodeUnavailable    = "unavailable"  // 503 (also used by injected faults)
	CodeRateLimited    = "rate_limited" // 429 (injected faults)
)

// Cursor is the decoded position of a walk.
type Cursor struct {
	// Fingerprint binds the cursor to one collection, filter and tenant.
	Fingerprint [fpLen]byte
	// Issued is when the server minted the cursor (for the TTL).
	Issued time.Time
	// UpdatedAt and ID are the sort key of the last item served.
	UpdatedAt time.Time
	ID        string
}

// CursorError is a rejected cursor (or another request error); Code is one
// of the Code constants and Status the HTTP status it is served with.
type CursorError struct {
	Code   string
	Status int
	Msg    string
}

func (e *CursorError) Error() string { return e.Code + ": " + e.Msg }

// Fingerprint digests what a cursor is valid for. The fields are length
// prefixed, so no two different triples collide by concatenation.
func Fingerprint(collection, filter, tenant string) [fpLen]byte {
	h := sha256.New()
	h.Write([]byte("tidemark-feed-fingerprint\x00"))
	for _, s := range []string{collection, filter, tenant} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	var fp [fpLen]byte
	copy(fp[:], h.Sum(nil))
	return fp
}

// EncodeCursor mints a version-1 cursor under key.
func EncodeCursor(key []byte, c Cursor) string {
	b := make([]byte, 0, v1Fixed+len(c.ID)+macLen)
	b = append(b, CursorVersion)
	b = append(b, c.Fingerprint[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(c.Issued.UnixMicro()))
	b = binary.BigEndian.AppendUint64(b, uint64(c.UpdatedAt.UnixMicro()))
	b = append(b, c.ID...)
	return seal(key, b)
}

// seal appends the MAC and encodes; it is also how tests mint cursors of
// other versions.
func seal(key, b []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(b)
	return base64.RawURLEncoding.EncodeToString(m.Sum(b))
}

// DecodeCursor authenticates and decodes s. It checks, in this order: the
// encoding (invalid_cursor), the MAC (cursor_tampered), the version
// (cursor_version) and the body (invalid_cursor). Binding to a collection
// and the TTL are the caller's checks (see Server). The cursor is data: it
// is never interpreted as SQL, its id reaches the database only as a bound
// parameter.
func DecodeCursor(key []byte, s string) (Cursor, *CursorError) {
	bad := func(code, format string, args ...any) (Cursor, *CursorError) {
		return Cursor{}, &CursorError{Code: code, Status: http.StatusBadRequest, Msg: fmt.Sprintf(format, args...)}
	}
	if s == "" {
		return bad(CodeInvalidCursor, "the cursor is empty; omit the parameter to start a walk")
	}
	if len(s) > 2*(v1Fixed+maxIDLen+macLen) {
		return bad(CodeInvalidCursor, "the cursor is too long to be one of ours")
	}
	// Only the base64url alphabet: Go's decoder skips '\r' and '\n' even
	// in strict mode, which would give one position two spellings.
	if !isBase64URL(s) {
		return bad(CodeInvalidCursor, "the cursor is not unpadded base64url; pass next_cursor back exactly as received")
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil {
		return bad(CodeInvalidCursor, "the cursor is not unpadded base64url; pass next_cursor back exactly as received")
	}
	if len(b) < 1+macLen {
		return bad(CodeInvalidCursor, "the cursor is too short to be one of ours")
	}
	body, mac := b[:len(b)-macLen], b[len(b)-macLen:]
	m := hmac.New(sha256.New, key)
	m.Write(body)
	if !hmac.Equal(mac, m.Sum(nil)) {
		return bad(CodeCursorTampered, "the cursor was not issued by this server (or was altered); start a new walk without a cursor")
	}
	if body[0] != CursorVersion {
		return bad(CodeCursorVersion, "cursor format version %d is not supported (this server speaks version %d); start a new walk without a cursor", body[0], CursorVersion)
	}
	if len(body) < v1Fixed {
		return bad(CodeInvalidCursor, "the cursor body is %d bytes, shorter than version 1's %d", len(body), v1Fixed)
	}
	var c Cursor
	copy(c.Fingerprint[:], body[1:1+fpLen])
	c.Issued = time.UnixMicro(int64(binary.BigEndian.Uint64(body[1+fpLen:]))).UTC()
	c.UpdatedAt = time.UnixMicro(int64(binary.BigEndian.Uint64(body[1+fpLen+8:]))).UTC()
	id := body[v1Fixed:]
	if len(id) > maxIDLen || !utf8.Valid(id) {
		return bad(CodeInvalidCursor, "the cursor's id is not UTF-8 text of at most %d bytes", maxIDLen)
	}
	c.ID = string(id)
	return c, nil
}

// isBase64URL reports whether s holds only the unpadded base64url alphabet.
func isBase64URL(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
