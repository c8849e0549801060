package main

import (
	"context"
	"log/slog"
	"regexp"
	"strings"

	"github.com/tidemark/tidemark/connector/httpsrc"
)

// urlRE finds absolute URLs in free text.
var urlRE = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://[^\s"'<>\\]+`)

// redactText redacts every URL in s (httpsrc.RedactURL): a link cursor
// carries the endpoint's query, which may hold an api_key
// (docs/http-source.md, Link cursors are stored).
func redactText(s string) string {
	if !strings.Contains(s, "://") {
		return s
	}
	return urlRE.ReplaceAllStringFunc(s, func(u string) string {
		u, tail := splitTrailing(u)
		return httpsrc.RedactURL(u) + tail
	})
}

// splitTrailing splits the punctuation that ends a sentence or a clause
// off a URL found in text ("fetch https://x/?k=v: refused"), so that it is
// neither redacted with the URL nor re-encoded into it. A closing
// parenthesis stays when the URL opened one.
func splitTrailing(u string) (url, tail string) {
	end := len(u)
	for end > 0 {
		c := u[end-1]
		if strings.IndexByte(".,;:!?", c) < 0 && (c != ')' || strings.Count(u[:end], "(") >= strings.Count(u[:end], ")")) {
			break
		}
		end--
	}
	return u[:end], u[end:]
}

// redactHandler redacts URLs in every log message and attribute: the
// engine logs cursors, which with link pagination are URLs.
type redactHandler struct{ slog.Handler }

func (h redactHandler) Handle(ctx context.Context, r slog.Record) error {
	nr := slog.NewRecord(r.Time, r.Level, redactText(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		nr.AddAttrs(redactAttr(a))
		return true
	})
	return h.Handler.Handle(ctx, nr)
}

func (h redactHandler) WithAttrs(as []slog.Attr) slog.Handler {
	out := make([]slog.Attr, len(as))
	for i, a := range as {
		out[i] = redactAttr(a)
	}
	return redactHandler{h.Handler.WithAttrs(out)}
}

func (h redactHandler) WithGroup(name string) slog.Handler {
	return redactHandler{h.Handler.WithGroup(name)}
}

func redactAttr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		a.Value = slog.StringValue(redactText(v.String()))
	case slog.KindGroup:
		g := v.Group()
		out := make([]slog.Attr, len(g))
		for i, x := range g {
			out[i] = redactAttr(x)
		}
		a.Value = slog.GroupValue(out...)
	case slog.KindAny:
		if err, ok := v.Any().(error); ok {
			a.Value = slog.StringValue(redactText(err.Error()))
		}
	}
	return a
}
