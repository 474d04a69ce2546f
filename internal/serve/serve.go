// Package serve is loaderd's daemon transport: an HTTP + msgpack API on a
// unix socket (and optionally loopback TCP) over the session core
// (internal/session), through which training processes open loader
// sessions over registered datasets and receive batch descriptors, while
// the batch bytes travel through shared memory without copying.
//
// Clients name a dataset and a backend, never a path, device or byte range.
// A session's shared memory is readable only by the uid that opened it
// (SO_PEERCRED); idle sessions are reaped.
package serve

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/session"
	"github.com/nvfeed/nvfeed/loader"
)

// Config configures a Server: the session core's configuration.
type Config = session.Config

// Server serves loader sessions over HTTP: a thin adapter over
// session.Manager.
type Server struct {
	mgr *session.Manager
	log *slog.Logger
}

// New makes a server.
func New(cfg Config) *Server {
	mgr := session.NewManager(cfg)
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Server{mgr: mgr, log: log}
}

type ctxKey struct{}

// caller returns the unix-socket peer (uid -1 when unknown).
func caller(r *http.Request) session.Caller {
	if v, ok := r.Context().Value(ctxKey{}).(int); ok {
		return session.Caller{UID: v}
	}
	return session.Caller{UID: -1}
}

// connContext records the peer's credentials (SO_PEERCRED) for unix
// connections.
func connContext(ctx context.Context, c net.Conn) context.Context {
	uid := -1
	if uc, ok := c.(*net.UnixConn); ok {
		if raw, err := uc.SyscallConn(); err == nil {
			raw.Control(func(fd uintptr) {
				if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
					uid = int(cred.Uid)
				}
			})
		}
	}
	return context.WithValue(ctx, ctxKey{}, uid)
}

// Handler returns the HTTP API.
func (s *Server) Handler() http.Handler {
	r := chi.NewRouter()
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	r.Handle("/metrics", promhttp.HandlerFor(s.mgr.Registry(), promhttp.HandlerOpts{}))
	r.Get("/v1/backends", s.backends)
	r.Post("/v1/sessions", s.open)
	r.Post("/v1/sessions/{id}/next", s.next)
	r.Post("/v1/sessions/{id}/release", s.release)
	r.Get("/v1/sessions/{id}/state", s.state)
	r.Delete("/v1/sessions/{id}", s.close)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, http.StatusNotFound, fmt.Sprintf("no route %s %s", r.Method, r.URL.Path))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path))
	})
	return r
}

func writeErr(w http.ResponseWriter, code int, msg string) {
	writeMsg(w, code, ErrorResponse{Error: msg})
}

// fail writes err with the status its sentinel maps to.
func fail(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, session.ErrInvalid):
		code = http.StatusBadRequest
	case errors.Is(err, session.ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, session.ErrForbidden):
		code = http.StatusForbidden
	case errors.Is(err, session.ErrBusy), errors.Is(err, session.ErrConflict):
		code = http.StatusConflict
	case errors.Is(err, session.ErrLimit):
		code = http.StatusTooManyRequests
	case errors.Is(err, context.Canceled):
		code = 499 // client went away
	}
	writeErr(w, code, err.Error())
}

func writeMsg(w http.ResponseWriter, code int, v any) {
	b, err := msgpack.Marshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(err.Error())
	}
	w.Header().Set("Content-Type", "application/msgpack")
	w.WriteHeader(code)
	w.Write(b)
}

const maxBody = 1 << 20

func decode(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return fmt.Errorf("%w: reading request body: %w", session.ErrInvalid, err)
	}
	if len(b) > maxBody {
		return fmt.Errorf("%w: request body larger than %d bytes", session.ErrInvalid, maxBody)
	}
	dec := msgpack.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields(true)
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: malformed msgpack request: %w", session.ErrInvalid, err)
	}
	return nil
}

func (s *Server) backends(w http.ResponseWriter, _ *http.Request) {
	writeMsg(w, http.StatusOK, BackendsResponse{Default: loader.DefaultBackend, PrefetchQueueDepth: loader.DefaultPrefetchQueueDepth, Backends: loader.Backends()})
}

func (s *Server) open(w http.ResponseWriter, r *http.Request) {
	var req OpenRequest
	if err := decode(r, &req); err != nil {
		fail(w, err)
		return
	}
	o, err := s.mgr.Open(caller(r), session.OpenParams{Dataset: req.Dataset, Backend: req.Backend, BackendOptions: req.BackendOptions,
		BatchSize: req.BatchSize, ShardID: req.ShardID, NumShards: req.NumShards, RandomShuffle: req.RandomShuffle, Seed: req.Seed,
		PadLastBatch: req.PadLastBatch, StickToShard: req.StickToShard, PrefetchQueueDepth: req.PrefetchQueueDepth,
		ReleaseAfter: req.ReleaseAfter, Memory: req.Memory, State: req.State})
	if err != nil {
		fail(w, err)
		return
	}
	writeMsg(w, http.StatusOK, OpenResponse{ID: o.ID, Shm: o.Memory.Path, ShmSize: o.Memory.Size, Slots: o.Slots,
		PrefetchQueueDepth: o.PrefetchQueueDepth, ReleaseAfter: o.ReleaseAfter, Epoch: o.Epoch, EpochBatches: o.EpochBatches})
}

func (s *Server) next(w http.ResponseWriter, r *http.Request) {
	var req NextRequest
	if r.ContentLength != 0 {
		if err := decode(r, &req); err != nil {
			fail(w, err)
			return
		}
	}
	d, err := s.mgr.Next(r.Context(), caller(r), chi.URLParam(r, "id"), req.Release)
	if err != nil {
		fail(w, err)
		return
	}
	writeMsg(w, http.StatusOK, NextResponse{EndOfEpoch: d.EndOfEpoch, Epoch: d.Epoch, Iteration: d.Iteration, EpochBatches: d.EpochBatches,
		Slot: d.Slot, Offsets: d.Offsets, Lengths: d.Lengths, Labels: d.Labels, Indices: d.Indices, Failed: d.Failed, Errors: d.Errors})
}

func (s *Server) release(w http.ResponseWriter, r *http.Request) {
	var req ReleaseRequest
	if err := decode(r, &req); err != nil {
		fail(w, err)
		return
	}
	if err := s.mgr.Release(caller(r), chi.URLParam(r, "id"), req.Slot); err != nil {
		fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) state(w http.ResponseWriter, r *http.Request) {
	st, err := s.mgr.State(caller(r), chi.URLParam(r, "id"))
	if err != nil {
		fail(w, err)
		return
	}
	writeMsg(w, http.StatusOK, st)
}

func (s *Server) close(w http.ResponseWriter, r *http.Request) {
	if err := s.mgr.Close(caller(r), chi.URLParam(r, "id")); err != nil {
		fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// CloseAll ends every session.
func (s *Server) CloseAll() { s.mgr.CloseAll() }

// Run serves on a unix socket at socketPath (and on tcpAddr, a loopback
// address, if not empty) until ctx is done; then it stops accepting, ends
// every session, removes the socket and returns nil.
func (s *Server) Run(ctx context.Context, socketPath, tcpAddr string) error {
	if err := removeStaleSocket(socketPath); err != nil {
		return err
	}
	ln, err := net.Listen("unix", socketPath)
	if err != nil {
		return fmt.Errorf("serve: listen on %s: %w", socketPath, err)
	}
	defer os.Remove(socketPath)
	os.Chmod(socketPath, 0o666) // any local user may ask; sessions are theirs alone
	srv := &http.Server{Handler: s.Handler(), ConnContext: connContext, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	if tcpAddr != "" {
		host, _, err := net.SplitHostPort(tcpAddr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			srv.Close()
			return fmt.Errorf("serve: --listen %q: only loopback addresses (127.0.0.1:PORT, [::1]:PORT)", tcpAddr)
		}
		tl, err := net.Listen("tcp", tcpAddr)
		if err != nil {
			srv.Close()
			return fmt.Errorf("serve: listen on %s: %w", tcpAddr, err)
		}
		go func() { errc <- srv.Serve(tl) }()
	}
	tick := time.NewTicker(max(s.mgr.Timeout()/4, 10*time.Millisecond))
	defer tick.Stop()
	s.log.Info("serve: listening", "socket", socketPath, "tcp", tcpAddr, "datasets", strings.Join(s.mgr.Datasets(), ","))
	for {
		select {
		case now := <-tick.C:
			s.mgr.Reap(now)
		case err := <-errc:
			s.CloseAll()
			return fmt.Errorf("serve: %w", err)
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			srv.Shutdown(sctx) // stop accepting; let in-flight requests finish
			cancel()
			srv.Close()
			s.CloseAll()
			s.log.Info("serve: stopped")
			return nil
		}
	}
}

// removeStaleSocket removes a socket file nobody listens on, and refuses
// one in use.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("serve: %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("serve: %s exists and is not a socket", path)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("serve: %s is in use by another daemon", path)
	}
	return os.Remove(path)
}
