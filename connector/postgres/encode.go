package postgres

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/tidemark/tidemark/schemas"
)

// kind is how one column's PostgreSQL text output becomes JSON (docs/design.md, "Records").
// It is decided once per column from the catalog; encoding a row is a
// switch per value, no reflection.
type kind uint8

const (
	kindString    kind = iota // JSON string of the text output (numeric, uuid, date, enum, ...)
	kindNumber                // int2, int4, int8, oid: the text output is a JSON number
	kindFloat                 // float4, float8: number, or "NaN"/"Infinity"/"-Infinity"
	kindBool                  // "t"/"f" -> true/false
	kindJSON                  // json, jsonb: embedded as is
	kindBytea                 // hex output -> standard base64 string
	kindTimestamp             // timestamp, timestamptz -> schemas.TimeLayout string
	kindArray                 // array text format -> JSON array of elem kind
	kindVerbatim              // already JSON (formatted by the reader): embedded as is
)

// Type OIDs with an encoding of their own (pg_type.dat; stable across
// releases).
const (
	oidBool        = 16
	oidBytea       = 17
	oidInt8        = 20
	oidInt2        = 21
	oidInt4        = 23
	oidText        = 25
	oidOID         = 26
	oidXID         = 28
	oidJSON        = 114
	oidFloat4      = 700
	oidFloat8      = 701
	oidVarchar     = 1043
	oidTimestamp   = 1114
	oidTimestamptz = 1184
	oidUUID        = 2950
	oidJSONB       = 3802
)

// kindOf returns the encoding of a (domain-resolved) scalar base type.
func kindOf(base uint32) kind {
	switch base {
	case oidInt2, oidInt4, oidInt8, oidOID:
		return kindNumber
	case oidFloat4, oidFloat8:
		return kindFloat
	case oidBool:
		return kindBool
	case oidJSON, oidJSONB:
		return kindJSON
	case oidBytea:
		return kindBytea
	case oidTimestamp, oidTimestamptz:
		return kindTimestamp
	}
	return kindString
}

// valueColumn is one column of the record value.
type valueColumn struct {
	name  string
	kind  kind
	elem  kind // element kind, for kindArray
	delim byte // element delimiter, for kindArray (pg_type.typdelim)
	key   []byte
}

// rowEncoder turns the text-format values of one row into the record's
// JSON object. It keeps scratch space between rows, so it is not safe for
// concurrent use; make one per page (or per goroutine).
type rowEncoder struct {
	cols    []valueColumn
	scratch []byte
}

// newValueColumns precomputes each column's JSON key, with the opening
// brace or separating comma in front.
func newValueColumns(cols []valueColumn) []valueColumn {
	out := slices.Clone(cols)
	for i := range out {
		sep := byte(',')
		if i == 0 {
			sep = '{'
		}
		out[i].key = append(appendString([]byte{sep}, []byte(out[i].name)), ':')
	}
	return out
}

// appendRow appends the JSON object for vals (one text-format value per
// column, nil for SQL NULL) to dst.
func (e *rowEncoder) appendRow(dst []byte, vals [][]byte) ([]byte, error) {
	if len(vals) != len(e.cols) {
		return dst, fmt.Errorf("row has %d values for %d columns", len(vals), len(e.cols))
	}
	if len(e.cols) == 0 {
		return append(dst, '{', '}'), nil
	}
	var err error
	for i := range e.cols {
		c := &e.cols[i]
		dst = append(dst, c.key...)
		v := vals[i]
		if v == nil {
			dst = append(dst, "null"...)
			continue
		}
		if c.kind == kindArray {
			dst, err = e.appendArray(dst, v, c.elem, c.delim)
		} else {
			dst, err = appendScalar(dst, v, c.kind)
		}
		if err != nil {
			return dst, fmt.Errorf("column %q: %w", c.name, err)
		}
	}
	return append(dst, '}'), nil
}

// appendScalar appends the JSON form of one non-NULL text value.
func appendScalar(dst, v []byte, k kind) ([]byte, error) {
	switch k {
	case kindNumber:
		if len(v) == 0 {
			return dst, errors.New("empty integer")
		}
		return append(dst, v...), nil
	case kindFloat:
		if len(v) == 0 {
			return dst, errors.New("empty float")
		}
		if c := v[0]; c == 'N' || c == 'I' || (c == '-' && len(v) > 1 && v[1] == 'I') {
			return appendString(dst, v), nil // NaN, Infinity, -Infinity
		}
		return append(dst, v...), nil
	case kindBool:
		if len(v) == 1 && v[0] == 't' {
			return append(dst, "true"...), nil
		}
		if len(v) == 1 && v[0] == 'f' {
			return append(dst, "false"...), nil
		}
		return dst, fmt.Errorf("boolean %q is neither t nor f", v)
	case kindJSON, kindVerbatim:
		if len(v) == 0 {
			return dst, errors.New("empty json")
		}
		return append(dst, v...), nil
	case kindBytea:
		return appendBytea(dst, v)
	case kindTimestamp:
		return appendTimestamp(dst, v)
	}
	return appendString(dst, v), nil
}

// appendBytea turns bytea hex output (`\x0aff`) into a base64 JSON string
// without a temporary allocation: the raw bytes are decoded into dst's spare
// capacity beyond where the base64 text goes, then encoded in front.
func appendBytea(dst, v []byte) ([]byte, error) {
	if len(v) < 2 || v[0] != '\\' || v[1] != 'x' || len(v)%2 != 0 {
		return dst, fmt.Errorf("bytea output %.20q is not hex format (bytea_output must be hex)", v)
	}
	hx := v[2:]
	n := len(hx) / 2
	enc := base64.StdEncoding.EncodedLen(n)
	dst = append(dst, '"')
	start := len(dst)
	dst = slices.Grow(dst, enc+n+1)
	raw := dst[start+enc : start+enc+n]
	if _, err := hex.Decode(raw, hx); err != nil {
		return dst[:start-1], fmt.Errorf("bytea: %w", err)
	}
	base64.StdEncoding.Encode(dst[start:start+enc], raw)
	dst = dst[:start+enc]
	return append(dst, '"'), nil
}

// appendTimestamp converts timestamp/timestamptz text output (DateStyle ISO,
// TimeZone UTC: "2024-05-01 12:00:00.000001+00") into a schemas.TimeLayout
// JSON string ("2024-05-01T12:00:00.000001Z"). infinity and -infinity stay
// those strings. The common shape is rewritten byte by byte; anything else
// (BC dates, years past 9999, a non-UTC offset) goes through time.Time.
func appendTimestamp(dst, v []byte) ([]byte, error) {
	if string(v) == "infinity" || string(v) == "-infinity" {
		return appendString(dst, v), nil
	}
	// yyyy-mm-dd hh:mm:ss[.f{1,6}][+00]
	if len(v) >= 19 && v[4] == '-' && v[7] == '-' && v[10] == ' ' && v[13] == ':' && v[16] == ':' &&
		digits(v[0:4]) && digits(v[5:7]) && digits(v[8:10]) && digits(v[11:13]) && digits(v[14:16]) && digits(v[17:19]) {
		rest := v[19:]
		var frac []byte
		if len(rest) > 0 && rest[0] == '.' {
			i := 1
			for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
				i++
			}
			frac, rest = rest[1:i], rest[i:]
		}
		if len(frac) <= 6 && (len(rest) == 0 || string(rest) == "+00") {
			dst = append(dst, '"')
			dst = append(dst, v[:10]...)
			dst = append(dst, 'T')
			dst = append(dst, v[11:19]...)
			dst = append(dst, '.')
			dst = append(dst, frac...)
			dst = append(dst, "000000"[len(frac):]...)
			return append(dst, 'Z', '"'), nil
		}
	}
	t, err := parseTimestamp(v)
	if err != nil {
		return dst, err
	}
	dst = append(dst, '"')
	dst = schemas.AppendTime(dst, t)
	return append(dst, '"'), nil
}

func digits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return len(b) > 0
}

// parseTimestamp is the general parser for ISO timestamp output:
// "Y...Y-MM-DD HH:MM:SS[.ffffff][±HH[:MM[:SS]]][ BC]".
func parseTimestamp(v []byte) (time.Time, error) {
	s := string(v)
	bad := func() (time.Time, error) { return time.Time{}, fmt.Errorf("unrecognised timestamp %q", s) }
	bc := false
	if len(s) > 3 && s[len(s)-3:] == " BC" {
		bc, s = true, s[:len(s)-3]
	}
	num := func(p *string, min, max int) (int, bool) {
		i := 0
		n := 0
		for i < len(*p) && i < max && (*p)[i] >= '0' && (*p)[i] <= '9' {
			n = n*10 + int((*p)[i]-'0')
			i++
		}
		if i < min {
			return 0, false
		}
		*p = (*p)[i:]
		return n, true
	}
	sep := func(p *string, c byte) bool {
		if len(*p) == 0 || (*p)[0] != c {
			return false
		}
		*p = (*p)[1:]
		return true
	}
	var f [6]int
	var ok bool
	if f[0], ok = num(&s, 4, 9); !ok || !sep(&s, '-') {
		return bad()
	}
	if f[1], ok = num(&s, 2, 2); !ok || !sep(&s, '-') {
		return bad()
	}
	if f[2], ok = num(&s, 2, 2); !ok || !sep(&s, ' ') {
		return bad()
	}
	if f[3], ok = num(&s, 2, 2); !ok || !sep(&s, ':') {
		return bad()
	}
	if f[4], ok = num(&s, 2, 2); !ok || !sep(&s, ':') {
		return bad()
	}
	if f[5], ok = num(&s, 2, 2); !ok {
		return bad()
	}
	usec := 0
	if sep(&s, '.') {
		before := len(s)
		if usec, ok = num(&s, 1, 6); !ok {
			return bad()
		}
		for i := before - len(s); i < 6; i++ {
			usec *= 10
		}
	}
	offset := 0
	if len(s) > 0 && (s[0] == '+' || s[0] == '-') {
		neg := s[0] == '-'
		s = s[1:]
		h, ok := num(&s, 2, 2)
		if !ok {
			return bad()
		}
		offset = h * 3600
		if sep(&s, ':') {
			m, ok := num(&s, 2, 2)
			if !ok {
				return bad()
			}
			offset += m * 60
			if sep(&s, ':') {
				sec, ok := num(&s, 2, 2)
				if !ok {
					return bad()
				}
				offset += sec
			}
		}
		if neg {
			offset = -offset
		}
	}
	if s != "" {
		return bad()
	}
	year := f[0]
	if bc {
		year = 1 - year // 1 BC is astronomical year 0
	}
	t := time.Date(year, time.Month(f[1]), f[2], f[3], f[4], f[5], usec*1000, time.UTC)
	return t.Add(-time.Duration(offset) * time.Second), nil
}

// appendArray converts PostgreSQL's array text output into a JSON array,
// encoding each element with elem. It handles nested braces (multi-dim),
// quoted elements with backslash escapes, unquoted NULL (SQL NULL) versus
// quoted "NULL" (a string), and the "[lo:hi]={...}" dimension decoration
// that appears when a lower bound is not 1 (the bounds are dropped: JSON
// arrays start at 0).
func (e *rowEncoder) appendArray(dst, v []byte, elem kind, delim byte) ([]byte, error) {
	bad := func(why string) ([]byte, error) {
		return dst, fmt.Errorf("array %.40q: %s", v, why)
	}
	i := 0
	if len(v) > 0 && v[0] == '[' {
		for i < len(v) && v[i] != '=' {
			i++
		}
		if i == len(v) {
			return bad("dimension decoration without '='")
		}
		i++
	}
	if i >= len(v) || v[i] != '{' {
		return bad("does not start with '{'")
	}
	depth := 0
	expectElem := true // at the start of a list or after a delimiter
	for i < len(v) {
		c := v[i]
		switch {
		case c == '{':
			if !expectElem {
				return bad("unexpected '{'")
			}
			dst = append(dst, '[')
			depth++
			i++
			continue
		case c == '}':
			if depth == 0 {
				return bad("unbalanced '}'")
			}
			if expectElem && dst[len(dst)-1] != '[' {
				return bad("empty element before '}'")
			}
			dst = append(dst, ']')
			depth--
			i++
			expectElem = false
			if depth == 0 {
				if i != len(v) {
					return bad("trailing text after the closing '}'")
				}
				return dst, nil
			}
			continue
		case c == delim && !expectElem:
			dst = append(dst, ',')
			i++
			expectElem = true
			continue
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
			continue
		}
		if !expectElem {
			return bad("missing delimiter")
		}
		var err error
		if c == '"' {
			// Quoted element: \x means x; always a value, never NULL.
			e.scratch = e.scratch[:0]
			i++
			closed := false
			for i < len(v) {
				c := v[i]
				if c == '\\' && i+1 < len(v) {
					e.scratch = append(e.scratch, v[i+1])
					i += 2
					continue
				}
				if c == '"' {
					closed = true
					i++
					break
				}
				e.scratch = append(e.scratch, c)
				i++
			}
			if !closed {
				return bad("unterminated quoted element")
			}
			dst, err = appendScalar(dst, e.scratch, elem)
		} else {
			// Unquoted element: runs to the delimiter or '}'; NULL is SQL NULL.
			start := i
			escaped := false
			for i < len(v) && v[i] != delim && v[i] != '}' && v[i] != '{' && v[i] != '"' {
				if v[i] == '\\' && i+1 < len(v) {
					escaped = true
					i++
				}
				i++
			}
			raw := trimSpace(v[start:i])
			switch {
			case len(raw) == 0:
				return bad("empty unquoted element")
			case !escaped && len(raw) == 4 && (raw[0]|0x20) == 'n' && (raw[1]|0x20) == 'u' && (raw[2]|0x20) == 'l' && (raw[3]|0x20) == 'l':
				dst = append(dst, "null"...)
			case escaped:
				e.scratch = e.scratch[:0]
				for j := 0; j < len(raw); j++ {
					if raw[j] == '\\' && j+1 < len(raw) {
						j++
					}
					e.scratch = append(e.scratch, raw[j])
				}
				dst, err = appendScalar(dst, e.scratch, elem)
			default:
				dst, err = appendScalar(dst, raw, elem)
			}
		}
		if err != nil {
			return dst, err
		}
		expectElem = false
	}
	return bad("unterminated")
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\n' || b[0] == '\r') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// safeASCII[c] is true for the ASCII bytes that appear verbatim inside a
// JSON string.
var safeASCII = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string. The escaping is fixed (it is
// part of the record format): `"` and `\` are backslash-escaped, \b \f \n
// \r \t use their short forms, other control characters are \u00XX, and
// everything else, including non-ASCII UTF-8 and <>&, is verbatim. Invalid
// UTF-8 (which PostgreSQL does not emit with client_encoding UTF8, except
// from a SQL_ASCII database, which check warns of) becomes U+FFFD so the
// output is always valid JSON.
func appendString(dst, s []byte) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if safeASCII[c] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
