package postgres

// A connection string parser of our own, to say what is wrong with a DSN
// without ever quoting it. pgx's parse errors quote the string with a
// best-effort redaction that misses `password = X`, `password= X`, quoted
// passwords holding \' and unencoded '@' in URL passwords, and their inner
// errors can quote a fragment of a misparsed password; none of that text
// is passed on (docs/operating.md, Security).

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DSNKeyword is one keyword=value of a libpq keyword/value connection
// string. Value is unquoted and unescaped; Start and End locate the raw
// value (quotes included) in the string.
type DSNKeyword struct {
	Key, Value string
	Start, End int
}

// DSNError says which part of a connection string is wrong and how to fix
// it. Its text never holds a value from the string. It wraps ErrBadConfig.
type DSNError struct {
	// Part names where: `keyword "sslmode"`, `the URL's user info`,
	// `environment variable PGSSLMODE`.
	Part string
	// Problem says what is wrong and the fix.
	Problem string
}

func (e *DSNError) Error() string { return "dsn: " + e.Part + ": " + e.Problem }

func (e *DSNError) Unwrap() error { return ErrBadConfig }

func isDSNSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

// ParseKeywordDSN splits a keyword/value connection string (host=h
// port=5432 password='a b\'c') as libpq and pgx read it: spaces may
// surround '=', a value is single-quoted or runs to the next space, and a
// backslash escapes the next character. On malformed input the error (a
// *DSNError) names the last well-formed keyword, never a value.
func ParseKeywordDSN(s string) ([]DSNKeyword, error) {
	var out []DSNKeyword
	where := func() string {
		if len(out) == 0 {
			return "the start of the string"
		}
		return fmt.Sprintf("the text after the value of keyword %q", out[len(out)-1].Key)
	}
	i := 0
	for {
		for i < len(s) && isDSNSpace(s[i]) {
			i++
		}
		if i == len(s) {
			return out, nil
		}
		ks := i
		for i < len(s) && s[i] != '=' && !isDSNSpace(s[i]) {
			i++
		}
		key := s[ks:i]
		for i < len(s) && isDSNSpace(s[i]) {
			i++
		}
		if key == "" || i == len(s) || s[i] != '=' {
			return nil, &DSNError{Part: where(), Problem: "a word that is not keyword=value; " +
				"quote values that hold spaces in single quotes (password='a b'), or put the password in source.password_env"}
		}
		i++
		for i < len(s) && isDSNSpace(s[i]) {
			i++
		}
		var v strings.Builder
		vs := i
		if i < len(s) && s[i] == '\'' {
			i++
			closed := false
			for i < len(s) {
				c := s[i]
				if c == '\\' && i+1 < len(s) {
					v.WriteByte(s[i+1])
					i += 2
					continue
				}
				i++
				if c == '\'' {
					closed = true
					break
				}
				v.WriteByte(c)
			}
			if !closed {
				return nil, &DSNError{Part: fmt.Sprintf("keyword %q", key), Problem: "its value opens a single quote that is never closed; " +
					"close it, and write a quote inside a value as \\'"}
			}
		} else {
			for i < len(s) && !isDSNSpace(s[i]) {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				v.WriteByte(s[i])
				i++
			}
		}
		out = append(out, DSNKeyword{Key: key, Value: v.String(), Start: vs, End: i})
	}
}

// urlForm reports whether dsn is in URL form, as pgx decides it.
func urlForm(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// encodeHint is the fix for a URL that special characters broke.
const encodeHint = "percent-encode special characters in the user name and password (@ as %40, / as %2F, ? as %3F, # as %23, : as %3A), or put the password in source.password_env"

// parseURLDSN reads a postgres:// URL as pgx does (the user info ends at
// the first '@' before any '/'; the host list at the first '/' or '?'),
// returning its settings, or a *DSNError naming the broken part.
func parseURLDSN(dsn string) (map[string]string, error) {
	p := dsn[strings.Index(dsn, "://")+3:]
	if i := strings.IndexAny(p, "@/"); i >= 0 && p[i] == '@' {
		p = p[i+1:]
	}
	end := strings.IndexAny(p, "/?")
	if end < 0 {
		end = len(p)
	}
	hostPart, rest := p[:end], p[end:]
	path, query, _ := strings.Cut(rest, "?")
	if strings.ContainsAny(hostPart, "@#") || strings.Contains(path, "@") {
		return nil, &DSNError{Part: "the URL's user info", Problem: "the password (or user name) holds an unencoded '@', '/' or '#'; " + encodeHint}
	}
	settings := map[string]string{}
	if hostPart != "" {
		var ports []string
		for _, hp := range strings.Split(hostPart, ",") {
			host, port := hp, ""
			if strings.HasPrefix(hp, "[") {
				e := strings.IndexByte(hp, ']')
				if e < 2 || (e+1 < len(hp) && hp[e+1] != ':') {
					return nil, &DSNError{Part: "the URL's host list", Problem: "a bracketed IPv6 address is malformed; write e.g. postgres://u@[::1]:5432/db"}
				}
				host, port = hp[1:e], strings.TrimPrefix(hp[e+1:], ":")
			} else if h, pt, ok := strings.Cut(hp, ":"); ok {
				host, port = h, pt
			}
			if strings.ContainsAny(host, " []") {
				return nil, &DSNError{Part: "the URL's host list", Problem: "a host holds a character a host name cannot; " + encodeHint}
			}
			ports = append(ports, port)
		}
		settings["port"] = strings.Join(ports, ",")
	}
	if query != "" {
		for n, pair := range strings.Split(query, "&") {
			k, v, ok := strings.Cut(pair, "=")
			if !ok || strings.Contains(v, "=") {
				return nil, &DSNError{Part: fmt.Sprintf("URL query parameter %d", n+1), Problem: "it is not one key=value; percent-encode '=' and '&' inside values (%3D, %26)"}
			}
			key, err1 := url.PathUnescape(k)
			val, err2 := url.PathUnescape(v)
			if err1 != nil || err2 != nil {
				return nil, &DSNError{Part: fmt.Sprintf("URL query parameter %d", n+1), Problem: "it holds a '%' that does not start a percent-encoded byte; write a literal % as %25"}
			}
			settings[key] = val
		}
	}
	return settings, nil
}

// dsnSettings returns the keywords a DSN sets, or a *DSNError naming the
// part that breaks its structure.
func dsnSettings(dsn string) (map[string]string, error) {
	if urlForm(dsn) {
		return parseURLDSN(dsn)
	}
	kws, err := ParseKeywordDSN(dsn)
	if err != nil {
		return nil, err
	}
	settings := map[string]string{}
	for _, kw := range kws {
		settings[kw.Key] = kw.Value
	}
	return settings, nil
}

// checkValue returns what is wrong with a known keyword's value, or "".
// The message never quotes the value.
func checkValue(key, v string) string {
	oneOf := func(allowed ...string) string {
		if slices.Contains(allowed, v) {
			return ""
		}
		return "not one of " + strings.Join(allowed, ", ")
	}
	nonNegInt := func() string {
		if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 0 {
			return "not a whole number of 0 or more"
		}
		return ""
	}
	switch key {
	case "sslmode":
		return oneOf("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
	case "sslcertmode":
		return oneOf("disable", "allow", "require")
	case "sslnegotiation":
		return oneOf("postgres", "direct")
	case "channel_binding":
		return oneOf("disable", "prefer", "require")
	case "target_session_attrs":
		return oneOf("any", "read-write", "read-only", "primary", "standby", "prefer-standby")
	case "min_protocol_version", "max_protocol_version":
		return oneOf("3.0", "3.2", "latest")
	case "default_query_exec_mode":
		return oneOf("cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol")
	case "port":
		for _, p := range strings.Split(v, ",") {
			if p == "" {
				continue
			}
			if n, err := strconv.ParseUint(p, 10, 16); err != nil || n < 1 {
				return "not a port number in 1..65535 (in a URL, a '/' or '@' in the password moves the port: " + encodeHint + ")"
			}
		}
	case "connect_timeout", "statement_cache_capacity", "description_cache_capacity":
		return nonNegInt()
	case "pool_max_conns":
		if n, err := strconv.ParseInt(v, 10, 32); err != nil || n < 1 {
			return "not a whole number of 1 or more"
		}
	case "pool_min_conns", "pool_min_idle_conns":
		return nonNegInt()
	case "pool_max_conn_lifetime", "pool_max_conn_idle_time", "pool_health_check_period", "pool_max_conn_lifetime_jitter", "pool_ping_timeout":
		if _, err := time.ParseDuration(v); err != nil {
			return "not a duration such as 30s or 1h"
		}
	case "sslrootcert", "sslcert", "sslkey":
		if v != "" && v != "system" {
			if _, err := os.Stat(v); err != nil {
				var pe *os.PathError
				if errors.As(err, &pe) {
					err = pe.Err
				}
				return fmt.Sprintf("the file %s cannot be read (%v)", v, err)
			}
		}
	}
	return ""
}

// pgEnv are the environment variables pgx reads for a keyword the DSN does
// not set, for the keywords checkValue knows.
var pgEnv = map[string]string{
	"PGPORT": "port", "PGCONNECT_TIMEOUT": "connect_timeout", "PGSSLMODE": "sslmode", "PGSSLCERTMODE": "sslcertmode",
	"PGSSLNEGOTIATION": "sslnegotiation", "PGTARGETSESSIONATTRS": "target_session_attrs", "PGCHANNELBINDING": "channel_binding",
	"PGMINPROTOCOLVERSION": "min_protocol_version", "PGMAXPROTOCOLVERSION": "max_protocol_version",
	"PGSSLROOTCERT": "sslrootcert", "PGSSLCERT": "sslcert", "PGSSLKEY": "sslkey",
}

// CheckDSN reports whether the PostgreSQL driver can use dsn (it also reads
// the PG* environment variables and the TLS files named). It returns nil or
// a *DSNError that names the part that is wrong, found by tidemark's own
// parser: the driver's own message is never passed on, because it can
// quote the password.
func CheckDSN(dsn string) error {
	settings, err := dsnSettings(dsn)
	if err != nil {
		return err
	}
	if _, perr := pgxpool.ParseConfig(dsn); perr == nil {
		return nil
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	where := "keyword"
	if urlForm(dsn) {
		where = "URL query parameter"
	}
	for _, k := range keys {
		if msg := checkValue(k, settings[k]); msg != "" {
			part := fmt.Sprintf("%s %q", where, k)
			if k == "port" && urlForm(dsn) {
				part = "the URL's port"
			}
			return &DSNError{Part: part, Problem: msg}
		}
	}
	if (settings["sslcert"] == "") != (settings["sslkey"] == "") {
		return &DSNError{Part: "keywords sslcert and sslkey", Problem: "they go together: set both for a client certificate, or neither"}
	}
	envNames := make([]string, 0, len(pgEnv))
	for name := range pgEnv {
		envNames = append(envNames, name)
	}
	slices.Sort(envNames)
	for _, name := range envNames {
		if v := os.Getenv(name); v != "" {
			if _, set := settings[pgEnv[name]]; !set {
				if msg := checkValue(pgEnv[name], v); msg != "" {
					return &DSNError{Part: "environment variable " + name, Problem: msg + "; fix or unset it"}
				}
			}
		}
	}
	return &DSNError{Part: "the connection string", Problem: "the PostgreSQL driver cannot use it (its message is not shown: it can quote the password); " +
		"check every keyword's value, the service file and the PG* environment variables, and quote values with spaces in single quotes"}
}

// dsnError is what connect returns for a DSN that pgxpool.ParseConfig
// refused: CheckDSN's finding, never pgx's text.
func dsnError(dsn string) error {
	if err := CheckDSN(dsn); err != nil {
		return err
	}
	return &DSNError{Part: "the connection string", Problem: "the PostgreSQL driver cannot use it (its message is not shown: it can quote the password)"}
}
