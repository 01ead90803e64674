package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"

	"github.com/phxmount/phxmount/internal/errs"
)

// Server serves the metrics over HTTP: /metrics in the Prometheus text
// format, and a one-line index at /.
type Server struct {
	ln   net.Listener
	srv  *http.Server
	done chan error
}

// Serve listens on addr (HOST:PORT; port 0 picks a free one) and serves
// the metrics until Close. The endpoint has no authentication, so an
// address with no host (":9464") listens on the loopback address
// 127.0.0.1 only; other interfaces take an explicit host ("0.0.0.0:9464",
// "[::]:9464", an interface's address).
func (m *Metrics) Serve(addr string) (*Server, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, errs.Wrap("metrics: listen", addr, errs.New(unix.EINVAL, "want HOST:PORT"))
	}
	if host == "" {
		host = "127.0.0.1"
	}
	network := "tcp"
	if ip := net.ParseIP(host); ip != nil && ip.To4() != nil {
		network = "tcp4" // "tcp" would take 0.0.0.0 for every IPv6 address too
	}
	ln, err := net.Listen(network, net.JoinHostPort(host, port))
	if err != nil {
		return nil, errs.Wrap("metrics: listen", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("phxmount: metrics at /metrics\n"))
	})
	s := &Server{ln: ln, done: make(chan error, 1),
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Loopback says whether the server listens on a loopback address only
// (no other machine can reach it).
func (s *Server) Loopback() bool {
	a, ok := s.ln.Addr().(*net.TCPAddr)
	return ok && a.IP.IsLoopback()
}

// URL is the metrics' URL.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() + "/metrics" }

// Close stops the server, letting scrapes in progress finish for up to 2 s.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if serr := <-s.done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return errs.Wrapf(err, "metrics: close %s", s.ln.Addr())
}
