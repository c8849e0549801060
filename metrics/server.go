package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler serves /metrics (Prometheus text or OpenMetrics), /healthz (200
// while the process serves) and /readyz (200 "ready", or 503 with one
// reason per line; see Ready).
func (m *Metrics) Handler() http.Handler { return handler(m.reg, m.Ready) }

func handler(g prometheus.Gatherer, ready func(context.Context) (bool, []string)) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ready, reasons := ready(r.Context())
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !ready {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready\n%s\n", strings.Join(reasons, "\n"))
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// Server is a running HTTP server for Handler.
type Server struct {
	srv  *http.Server
	ln   net.Listener
	done chan error

	once sync.Once
	err  error
}

// Listen binds addr (host:port; port 0 picks a free one) and serves Handler
// in the background until Shutdown.
func (m *Metrics) Listen(addr string) (*Server, error) { return listen(addr, m.Handler()) }

func listen(addr string, h http.Handler) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	s := &Server{
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout: 30 * time.Second, WriteTimeout: 60 * time.Second},
		ln: ln, done: make(chan error, 1),
	}
	go func() {
		err := s.srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.done <- err
	}()
	return s, nil
}

// Addr is the bound address, e.g. "127.0.0.1:9464".
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Shutdown stops accepting, waits for in-flight requests until ctx ends, and
// returns once the server goroutine has exited. Later calls return the
// first call's result.
func (s *Server) Shutdown(ctx context.Context) error {
	s.once.Do(func() {
		err := s.srv.Shutdown(ctx)
		if err != nil {
			_ = s.srv.Close()
		}
		if serr := <-s.done; err == nil {
			err = serr
		}
		s.err = err
	})
	return s.err
}
