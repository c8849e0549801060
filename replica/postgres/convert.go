package postgres

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// kind is how one column's JSON value becomes PostgreSQL text input: the
// inverse of the source's value encoding (connector/postgres encode.go).
type kind uint8

const (
	kindScalar kind = iota // text input of the JSON string's content, the number's literal, true/false
	kindJSON               // json, jsonb: the embedded JSON text as is
	kindBytea              // base64 string -> \x hex input
	kindArray              // JSON array -> array literal of elem kind
	kindTime               // date, timestamp, timestamptz: astronomical years <= 0 -> BC
)

// member is one top-level member of a record value, in document order.
type member struct {
	name string
	raw  json.RawMessage
}

// decodeObject splits a record value into its members, keeping their order
// and their raw JSON (so json/jsonb columns keep their exact text).
func decodeObject(v []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("value is not JSON: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("value is not a JSON object")
	}
	var out []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("value is not JSON: %w", err)
		}
		name, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("value is not JSON (member %q): %w", name, err)
		}
		out = append(out, member{name: name, raw: raw})
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("value is not JSON: %w", err)
	}
	return out, nil
}

// isNull reports whether raw is the JSON null.
func isNull(raw []byte) bool { return string(raw) == "null" }

// toText converts one non-null JSON value to PostgreSQL text input for a
// column of kind k (elem for arrays).
func toText(raw []byte, k, elem kind) (string, error) {
	switch k {
	case kindJSON:
		return string(raw), nil
	case kindBytea:
		return byteaText(raw)
	case kindArray:
		var b []byte
		b, err := appendArray(b, raw, elem)
		return string(b), err
	case kindTime:
		s, err := scalarText(raw)
		return bcText(s), err
	}
	return scalarText(raw)
}

// bcText is the text input of a date or timestamp the records write with
// an astronomical year of 0 or below (0000-03-15, -0043-03-15T12:00:00Z:
// RFC 3339 has no era), which PostgreSQL reads only as a year BC: 1 BC is
// year 0, 44 BC year -43. Other values are returned as they are.
func bcText(s string) string {
	neg := strings.HasPrefix(s, "-")
	digits := strings.TrimPrefix(s, "-")
	end := strings.IndexByte(digits, '-')
	if end < 4 {
		return s
	}
	year, err := strconv.Atoi(digits[:end])
	if err != nil || !neg && year != 0 {
		return s
	}
	if neg {
		year = -year
	}
	rest := digits[end:]
	if i := strings.IndexByte(rest, 'T'); i >= 0 {
		rest = rest[:i] + " " + rest[i+1:]
	}
	if strings.HasSuffix(rest, "Z") {
		rest = strings.TrimSuffix(rest, "Z") + "+00"
	}
	return fmt.Sprintf("%04d%s BC", 1-year, rest)
}

// scalarText is the text input for a scalar column: a string's content, a
// number's literal, true or false; objects and arrays as their JSON text
// (a text column takes them, any other type rejects them with its own
// message).
func scalarText(raw []byte) (string, error) {
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", err
		}
		return s, nil
	case 't':
		return "true", nil
	case 'f':
		return "false", nil
	}
	return string(raw), nil
}

func byteaText(raw []byte) (string, error) {
	if raw[0] != '"' {
		return "", fmt.Errorf("bytea must be a base64 string, got %.20s", raw)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", err
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return "", fmt.Errorf("bytea is not standard base64: %w", err)
	}
	return `\x` + hex.EncodeToString(b), nil
}

// appendArray appends the array literal for a JSON array: every element
// quoted, NULL for null, nested arrays as nested braces.
func appendArray(dst, raw []byte, elem kind) ([]byte, error) {
	if raw[0] != '[' {
		return dst, fmt.Errorf("expected a JSON array, got %.20s", raw)
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return dst, err
	}
	dst = append(dst, '{')
	for i, e := range elems {
		if i > 0 {
			dst = append(dst, ',')
		}
		switch {
		case isNull(e):
			dst = append(dst, "NULL"...)
		case e[0] == '[' && elem != kindJSON:
			var err error
			if dst, err = appendArray(dst, e, elem); err != nil {
				return dst, err
			}
		default:
			s, err := toText(e, elem, kindScalar)
			if err != nil {
				return dst, fmt.Errorf("element %d: %w", i, err)
			}
			dst = appendQuoted(dst, s)
		}
	}
	return append(dst, '}'), nil
}

func appendQuoted(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			dst = append(dst, '\\')
		}
		dst = append(dst, s[i])
	}
	return append(dst, '"')
}

// jsonClass is what type inference sees in one JSON value.
type jsonClass uint8

const (
	classNull jsonClass = iota
	classInt
	classFloat // a number with a fraction or exponent, or NaN/Infinity strings
	classBool
	classTimestamp
	classUUID
	classString
	classJSON // object or array
	// classWideInt is an integer a double would round (beyond 2^53) that
	// a bigint holds; classHugeInt one beyond a bigint (an HTTP source's).
	classWideInt
	classHugeInt
)

// exactInDouble is the largest integer every smaller one of which a
// double holds exactly.
const exactInDouble = 1 << 53

func classify(raw []byte) jsonClass {
	switch raw[0] {
	case 'n':
		return classNull
	case 't', 'f':
		return classBool
	case '{', '[':
		return classJSON
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return classString
		}
		switch {
		case s == "NaN" || s == "Infinity" || s == "-Infinity":
			return classFloat
		case isTimestamp(s):
			return classTimestamp
		case isUUID(s):
			return classUUID
		}
		return classString
	}
	if n, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		if n > exactInDouble || n < -exactInDouble {
			return classWideInt
		}
		return classInt
	} else if errors.Is(err, strconv.ErrRange) {
		return classHugeInt
	}
	return classFloat
}

// isTimestamp matches the value encoding of timestamps:
// 2024-05-01T12:00:00.000001Z, infinity, -infinity.
func isTimestamp(s string) bool {
	if s == "infinity" || s == "-infinity" {
		return true
	}
	if len(s) != 27 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' || s[19] != '.' || s[26] != 'Z' {
		return false
	}
	for _, i := range []int{0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18, 20, 21, 22, 23, 24, 25} {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
	}
	return true
}

// inferType is the column type inferred from the classes seen in a batch
// (docs/replica.md has the table).
func inferType(seen map[jsonClass]bool) string {
	delete(seen, classNull)
	only := func(cs ...jsonClass) bool {
		if len(seen) == 0 {
			return false
		}
		for c := range seen {
			ok := false
			for _, x := range cs {
				ok = ok || c == x
			}
			if !ok {
				return false
			}
		}
		return true
	}
	switch {
	case len(seen) == 0:
		return "text"
	case only(classBool):
		return "boolean"
	case only(classInt, classWideInt):
		return "bigint"
	case only(classInt, classFloat):
		return "double precision"
	case only(classInt, classWideInt, classHugeInt, classFloat):
		// Integers a bigint cannot hold, or a double would round beside
		// fractions: numeric holds every one as written.
		return "numeric"
	case only(classTimestamp):
		return "timestamp with time zone"
	case only(classUUID):
		return "uuid"
	case seen[classJSON]:
		return "jsonb"
	}
	return "text"
}
