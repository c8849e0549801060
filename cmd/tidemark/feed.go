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
			return hc, &ConfigError{Key: "source.http.auth_value_env", Msg: fmt.Sprintf("environment variable %s is not set or empty", h.AuthValueEnv)}
		}
	case h.AuthValueFile != "":
		v, err := readSecretFile(h.AuthValueFile)
		if err != nil {
			return hc, &ConfigError{Key: "source.http.auth_value_file", Msg: err.Error()}
		}
		hc.AuthValue = v
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
	listen        string
	path          string
	keyFile       string
	tenant        string
	cursorTTL     time.Duration
	authTokenFile string
}

// Environment variables for the feed's secrets, when no file is given.
const (
	envFeedKey   = "TIDEMARK_FEED_HMAC_KEY"
	envFeedToken = "TIDEMARK_FEED_AUTH_TOKEN"
)

// feedArgs registers the feed's flags and strips its subcommand.
func (a *cli) feedArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	if len(args) == 0 || args[0] != "serve" {
		return nil, fmt.Errorf("use `tidemark feed serve --config FILE [flags]`: %w", errUsage)
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
	return args[1:], nil
}

// cmdFeed serves the configured PostgreSQL table as a changes API until
// ctx is cancelled.
func cmdFeed(ctx context.Context, a *cli) error {
	defer a.closeAll()
	o := a.feed
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
	if len(key) < 16 {
		return &ConfigError{Key: "--hmac-key-file", Msg: fmt.Sprintf("the cursor key is %d bytes; give at least 16 (e.g. head -c 32 /dev/urandom | base64 > feed.key) in --hmac-key-file or %s", len(key), envFeedKey)}
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
	table, err := postgres.New(ctx, pc)
	if err != nil {
		return openError("source.dsn", pc.DSN, "open PostgreSQL table", err)
	}
	a.closers = append(a.closers, table.Close)
	srv, err := feed.New(feed.Config{
		Table: table, Key: key, Collection: pc.Schema + "." + pc.Table, Filter: pc.Filter, Tenant: o.tenant,
		CursorTTL: o.cursorTTL, AuthToken: token, Logger: a.log,
	})
	if err != nil {
		return &ConfigError{Msg: err.Error()}
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return &ConfigError{Key: "--listen", Msg: err.Error()}
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+o.path, srv)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	url := "http://" + ln.Addr().String() + o.path
	fmt.Fprintf(a.stdout, "serving %s.%s at %s\n", pc.Schema, pc.Table, url)
	a.log.Info("feed serving", "url", url, "table", pc.Schema+"."+pc.Table, "tenant", o.tenant, "auth", token != "")
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return hs.Shutdown(sctx)
}
