package main

// HTTP wiring: the http source's configuration (source.kind http) and
// `tidemark feed serve`, the reference changes API (package feed) over the
// configured PostgreSQL table.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tidemark/tidemark/connector/httpsrc"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/feed"
)

// httpConfig builds the http source's configuration, reading the auth
// header value from its variable or file. Errors never contain the value.
func (a *cli) httpConfig() (httpsrc.Config, error) {
	h := a.cfg.Source.HTTP
	hc := httpsrc.Config{
		Endpoint:   a.cfg.Source.DSN,
		SinceParam: h.SinceParam, CursorParam: h.CursorParam, LimitParam: h.LimitParam, MaxLimit: h.MaxLimit,
		ItemsPath: h.ItemsPath, IDPath: h.IDPath, UpdatedAtPath: h.UpdatedAtPath,
		DeletedPath: h.DeletedPath, DeletedAtPath: h.DeletedAtPath, ValuePath: h.ValuePath,
		Pagination: httpsrc.Pagination(h.Pagination), NextCursorPath: h.NextCursorPath, HasMorePath: h.HasMorePath,
		AuthHeader: h.AuthHeader, RejectCodes: h.RejectCodes, ErrorCodePath: h.ErrorCodePath,
		RequestTimeout: h.RequestTimeout.Duration, MaxRetries: h.MaxRetries, MaxRetryAfter: h.MaxRetryAfter.Duration,
		MaxEmptyPages: h.MaxEmptyPages,
		Logger:        a.log,
	}
	for _, s := range h.RejectStatuses {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return hc, &ConfigError{Key: "source.http.reject_statuses", Msg: fmt.Sprintf("%q is not a status", s)}
		}
		hc.RejectStatuses = append(hc.RejectStatuses, n)
	}
	switch {
	case h.AuthValueEnv != "":
		hc.AuthValue = a.env(h.AuthValueEnv)
		if hc.AuthValue == "" {
			return hc, &ConfigError{Key: "source.http.auth_value_env", Msg: fmt.Sprintf("environment variable %s is not set or empty", h.AuthValueEnv), Credentials: true}
		}
	case h.AuthValueFile != "":
		v, err := readSecretFile(h.AuthValueFile)
		if err != nil {
			return hc, &ConfigError{Key: "source.http.auth_value_file", Msg: err.Error(), Credentials: true}
		}
		hc.AuthValue = v // read here to fail at start with exit 2
		hc.AuthValueFile = h.AuthValueFile
	}
	return hc, nil
}

// readSecretFile reads a one-line secret; one trailing newline is trimmed.
// The error names the file, never the content.
func readSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return "", fmt.Errorf("read %s: %v", path, err)
	}
	v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if v == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return v, nil
}

// feedOptions are the flags of `tidemark feed serve`.
type feedOptions struct {
	listen         string
	path           string
	keyFile        string
	tenant         string
	cursorTTL      time.Duration
	authTokenFile  string
	publicURL      string
	trustForwarded bool
	limits         feed.Limits
}

// Environment variables for the feed's secrets, when no file is given.
const (
	envFeedKey   = "TIDEMARK_FEED_HMAC_KEY"
	envFeedToken = "TIDEMARK_FEED_AUTH_TOKEN"
)

// feedArgs registers the feed's flags and strips its subcommand. `feed
// --help` is the help of `feed serve`, its one subcommand.
func (a *cli) feedArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	help := len(args) > 0 && slices.Contains([]string{"-h", "-help", "--help"}, args[0])
	if !help && (len(args) == 0 || args[0] != "serve") {
		return nil, usageErrorf("use `tidemark feed serve --config FILE [flags]`")
	}
	o := &a.feed
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address to listen on (loopback by default; put TLS in front to expose it)")
	fs.StringVar(&o.path, "path", "/changes", "URL path of the changes API")
	fs.StringVar(&o.keyFile, "hmac-key-file", "", "file holding the cursor HMAC key, at least 16 bytes (default: env "+envFeedKey+")")
	fs.StringVar(&o.tenant, "tenant", "", "tenant label bound into every cursor")
	fs.Func("filter", "SQL filter over the table (same as --source.filter); bound into every cursor", func(v string) error {
		a.overrides = append(a.overrides, "source.filter="+v)
		return nil
	})
	fs.DurationVar(&o.cursorTTL, "cursor-ttl", 0, "refuse cursors older than this with 410 cursor_expired (0: never)")
	fs.StringVar(&o.authTokenFile, "auth-token-file", "", "require Authorization: Bearer <token from this file> (default: env "+envFeedToken+", else none)")
	fs.StringVar(&o.publicURL, "public-url", "", "the endpoint's public URL, e.g. https://api.example.com/v1/changes: next links are built on it (default: links relative to the request, never from the Host header)")
	fs.BoolVar(&o.trustForwarded, "trust-forwarded", false, "build next links from X-Forwarded-Proto and X-Forwarded-Host (only behind a proxy that sets them)")
	d := feed.DefaultLimits()
	fs.DurationVar(&o.limits.ReadHeaderTimeout, "read-header-timeout", d.ReadHeaderTimeout, "longest time to read a request's headers")
	fs.DurationVar(&o.limits.ReadTimeout, "read-timeout", d.ReadTimeout, "longest time to read a whole request")
	fs.DurationVar(&o.limits.WriteTimeout, "write-timeout", d.WriteTimeout, "longest time to write an answer")
	fs.DurationVar(&o.limits.IdleTimeout, "idle-timeout", d.IdleTimeout, "close a keep-alive connection idle this long")
	fs.IntVar(&o.limits.MaxConns, "max-conns", d.MaxConns, "most connections open at once; more are answered 503 with Retry-After")
	if help {
		return args, nil
	}
	return args[1:], nil
}

// cmdFeed serves the configured PostgreSQL table as a changes API until
// ctx is cancelled.
func cmdFeed(ctx context.Context, a *cli) error {
	defer a.closeAll()
	o := a.feed
	if len(a.cfg.Tasks) > 0 {
		return &ConfigError{Key: "tables", Origin: a.cfg.origin["tables"], Msg: "tidemark feed serve serves one table, and this configuration lists several; " +
			"run it with a single-table configuration (source.table instead of tables:), one process per table to serve"}
	}
	if a.cfg.Source.Kind != "postgres" {
		return &ConfigError{Key: "source.kind", Msg: "tidemark feed serve serves a PostgreSQL table; set source.kind postgres and the table's keys"}
	}
	key := []byte(a.env(envFeedKey))
	if o.keyFile != "" {
		k, err := readSecretFile(o.keyFile)
		if err != nil {
			return &ConfigError{Key: "--hmac-key-file", Msg: err.Error()}
		}
		key = []byte(k)
	}
	if err := feed.CheckKey(key); err != nil {
		return &ConfigError{Key: "--hmac-key-file", Msg: fmt.Sprintf("%v (in --hmac-key-file or %s)", err, envFeedKey)}
	}
	if !strings.HasPrefix(o.path, "/") || strings.ContainsAny(o.path, " \t\r\n{}?#") {
		return &ConfigError{Key: "--path", Msg: fmt.Sprintf("%q is not a URL path to serve; write one with a leading slash and no spaces, braces, '?' or '#', e.g. /changes", o.path)}
	}
	l := o.limits
	if l.ReadHeaderTimeout <= 0 || l.ReadTimeout <= 0 || l.WriteTimeout <= 0 || l.IdleTimeout <= 0 || l.MaxConns < 1 {
		return &ConfigError{Key: "--max-conns", Msg: "the feed's timeouts must be positive and --max-conns at least 1: an unbounded server can be held open by idle or trickling clients"}
	}
	token := a.env(envFeedToken)
	if o.authTokenFile != "" {
		t, err := readSecretFile(o.authTokenFile)
		if err != nil {
			return &ConfigError{Key: "--auth-token-file", Msg: err.Error()}
		}
		token = t
	}
	pc, err := a.pgConfig()
	if err != nil {
		return err
	}
	if err := a.checkDSN("source.dsn", pc.DSN); err != nil { // dsn.go
		return err
	}
	// The feed serves what its role may read: a row-level security policy
	// may scope it on purpose (postgres.Config.RowSecurity).
	pc.RowSecurity = true
	table, err := postgres.New(ctx, pc)
	if err != nil {
		return openError("source.dsn", pc.DSN, "open PostgreSQL table", err)
	}
	a.closers = append(a.closers, table.Close)
	srv, err := feed.New(feed.Config{
		Table: table, Key: key, Collection: feedCollection(pc.Schema, pc.Table), Filter: pc.Filter, Tenant: o.tenant,
		CursorTTL: o.cursorTTL, AuthToken: token, PublicURL: o.publicURL, TrustForwarded: o.trustForwarded, Logger: a.log,
	})
	if err != nil {
		return &ConfigError{Key: "feed serve", Msg: err.Error()}
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return &ConfigError{Key: "--listen", Msg: err.Error()}
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+o.path, srv)
	hs := l.Server(mux)
	ln = l.Listener(ln)
	url := "http://" + ln.Addr().String() + o.path
	fmt.Fprintf(a.stdout, "serving %s.%s at %s\n", pc.Schema, pc.Table, url)
	a.log.Info("feed serving", "url", url, "table", pc.Schema+"."+pc.Table, "tenant", o.tenant, "auth", token != "")
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	a.log.Info("feed limits", "read_header_timeout", l.ReadHeaderTimeout, "read_timeout", l.ReadTimeout,
		"write_timeout", l.WriteTimeout, "idle_timeout", l.IdleTimeout, "max_conns", l.MaxConns)
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return hs.Shutdown(sctx)
}

// feedCollection names the served table in every cursor's fingerprint:
// schema and table as quoted identifiers, so that schema "x.y" table "z"
// and schema "x" table "y.z" differ. A name without '.' or '"' keeps its
// plain spelling (public.orders), so cursors minted before stay valid.
func feedCollection(schema, table string) string {
	q := func(id string) string {
		if !strings.ContainsAny(id, `."`) {
			return id
		}
		return `"` + strings.ReplaceAll(id, `"`, `""`) + `"`
	}
	return q(schema) + "." + q(table)
}
