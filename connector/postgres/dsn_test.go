package postgres_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidemark/tidemark/connector/postgres"
)

// leakyDSNs are connection strings that pgx cannot parse and whose parse
// errors, passed through, printed the password: spellings pgx's redaction
// misses, and misparses that make a password fragment a keyword.
var leakyDSNs = map[string]string{
	"spaces around =":        "host=127.0.0.1 password = Pw-S3cret-9 sslmode=bogus",
	"space after =":          "host=127.0.0.1 password= Pw-S3cret-9 sslmode=bogus",
	"quoted with \\'":        `host=127.0.0.1 password='Pw-S3cret\'9' sslmode=bogus`,
	"unquoted space":         "host=127.0.0.1 password=Pw S3cret-9 dbname=x",
	"URL, unencoded @":       "postgres://u:Pw@S3cret-9@127.0.0.1/db?sslmode=require",
	"URL, unencoded /":       "postgres://u:Pw/S3cret-9@127.0.0.1/db",
	"URL, bad sslmode":       "postgres://u:Pw-S3cret-9@127.0.0.1/db?sslmode=bogus",
	"URL, password in query": "postgres://u@127.0.0.1/db?password=Pw-S3cret-9&sslmode=bogus",
	"unterminated quote":     "host=127.0.0.1 password='Pw-S3cret-9",
	"bad port":               "host=127.0.0.1 port=5x password=Pw-S3cret-9",
}

// wantParts is the part each error must name.
var wantParts = map[string]string{
	"spaces around =": `keyword "sslmode"`, "space after =": `keyword "sslmode"`, "quoted with \\'": `keyword "sslmode"`,
	"unquoted space": `after the value of keyword "password"`, "URL, unencoded @": "the URL's user info",
	"URL, unencoded /": "the URL's user info", "URL, bad sslmode": `URL query parameter "sslmode"`,
	"URL, password in query": `URL query parameter "sslmode"`, "unterminated quote": `keyword "password"`, "bad port": `keyword "port"`,
}

func TestDSNErrorsNeverQuoteThePassword(t *testing.T) {
	for name, dsn := range leakyDSNs {
		t.Run(name, func(t *testing.T) {
			errs := map[string]error{"CheckDSN": postgres.CheckDSN(dsn)}
			// pgx parses an unencoded '@' in a URL password (the host
			// becomes "S3cret-9@127.0.0.1"), so only a connect error
			// follows; New checks nothing before it connects. The CLI runs
			// CheckDSN first (cmd/tidemark/dsn.go).
			if name != "URL, unencoded @" {
				_, err := postgres.New(context.Background(), postgres.Config{DSN: dsn, Table: "t"})
				errs["New"] = err
			}
			for what, err := range errs {
				if err == nil {
					t.Fatalf("%s accepted it", what)
				}
				msg := err.Error()
				for _, frag := range []string{"S3cret", "Pw-", "Pw@", "Pw/"} {
					if strings.Contains(msg, frag) {
						t.Errorf("%s: the error quotes the password (%q): %s", what, frag, msg)
					}
				}
				var de *postgres.DSNError
				if !errors.As(err, &de) || !errors.Is(err, postgres.ErrBadConfig) {
					t.Errorf("%s: %T %v, want a *DSNError wrapping ErrBadConfig", what, err, err)
				}
				if !strings.Contains(msg, wantParts[name]) {
					t.Errorf("%s: the error does not name %s: %s", what, wantParts[name], msg)
				}
			}
		})
	}
}

func TestCheckDSNAcceptsGood(t *testing.T) {
	for _, dsn := range []string{
		"host=127.0.0.1 port=5432 dbname=x user=u password='a b\\'c' sslmode=disable",
		"postgres://u:p%40ss@127.0.0.1:5432,127.0.0.2/db?sslmode=verify-full&application_name=a@b",
		"postgresql:///db?host=/tmp",
		"dbname=shop",
	} {
		if err := postgres.CheckDSN(dsn); err != nil {
			t.Errorf("%s: %v", dsn, err)
		}
	}
	t.Setenv("PGSSLMODE", "sometimes")
	if err := postgres.CheckDSN("host=127.0.0.1 dbname=x"); err == nil || !strings.Contains(err.Error(), "environment variable PGSSLMODE") {
		t.Errorf("a bad PGSSLMODE: %v", err)
	}
	if err := postgres.CheckDSN("host=127.0.0.1 dbname=x sslmode=disable"); err != nil {
		t.Errorf("the DSN's own sslmode wins over PGSSLMODE: %v", err)
	}
}

func TestParseKeywordDSN(t *testing.T) {
	kws, err := postgres.ParseKeywordDSN(`host=h  password = 'a b\'c'  port=5432 x=a\ b`)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"host=h", "password=a b'c", "port=5432", "x=a b"}
	if len(kws) != len(want) {
		t.Fatalf("%+v", kws)
	}
	s := `host=h  password = 'a b\'c'  port=5432 x=a\ b`
	for i, kw := range kws {
		if kw.Key+"="+kw.Value != want[i] {
			t.Errorf("keyword %d: %s=%s, want %s", i, kw.Key, kw.Value, want[i])
		}
		if i == 1 && s[kw.Start:kw.End] != `'a b\'c'` {
			t.Errorf("raw value %q", s[kw.Start:kw.End])
		}
	}
}

// TestPasswordFileErrorsNameTheFile: a password file that is missing or
// empty when a connection opens fails that connection (the pool's and the
// listener's alike) with an error that names the file and what to do,
// and never holds a password.
func TestPasswordFileErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const dsn = "postgres://u:Sup3r-S3cret-pw@127.0.0.1:1/d?connect_timeout=2"
	for _, tc := range []struct{ path, want string }{
		{missing, "read password file " + missing + ": no such file or directory"},
		{empty, "password file " + empty + " is empty; write the password into it"},
	} {
		cfg := postgres.Config{DSN: dsn, PasswordFile: tc.path, Table: "t"}
		_, err := postgres.New(context.Background(), cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "S3cret") {
			t.Errorf("New with password file %s: %v; want an error saying %q", tc.path, err, tc.want)
		}
		_, err = postgres.Listen(context.Background(), cfg, postgres.ListenConfig{Channel: "c"})
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "S3cret") {
			t.Errorf("Listen with password file %s: %v; want an error saying %q", tc.path, err, tc.want)
		}
	}
}
