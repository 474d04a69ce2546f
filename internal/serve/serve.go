// Package serve is loaderd's daemon: an HTTP API on a unix socket (and
// optionally loopback TCP) through which training processes open loader
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
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader"
)

// Config configures a Server.
type Config struct {
	Datasets        map[string]*bmap.Map // registered datasets by name
	ShmDir          string               // where session memory lives; default /dev/shm
	SessionTimeout  time.Duration        // idle sessions are closed after this; default 60s
	MaxSessionBytes int64                // refuse sessions needing more batch memory; default 16 GiB
	MaxSessions     int                  // default 64
	Logger          *slog.Logger
}

// Server serves loader sessions.
type Server struct {
	cfg      Config
	log      *slog.Logger
	mu       sync.Mutex
	sessions map[string]*session
	metrics  *metrics
	reg      *prometheus.Registry
}

type session struct {
	id, dataset, backend string
	uid                  int // -1 when unknown (TCP)
	l                    *loader.Loader
	mu                   sync.Mutex // one request at a time
	held                 map[int]*loader.Batch
	slots                int
	lastUsed             atomic.Int64
	closed               bool
}

// New makes a server.
func New(cfg Config) *Server {
	if cfg.ShmDir == "" {
		cfg.ShmDir = "/dev/shm"
	}
	if cfg.SessionTimeout == 0 {
		cfg.SessionTimeout = 60 * time.Second
	}
	if cfg.MaxSessionBytes == 0 {
		cfg.MaxSessionBytes = 16 << 30
	}
	if cfg.MaxSessions == 0 {
		cfg.MaxSessions = 64
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, log: cfg.Logger, sessions: map[string]*session{}, reg: prometheus.NewRegistry()}
	s.metrics = newMetrics(s.reg, s)
	return s
}

type ctxKey struct{}

// peerUID returns the uid of the unix-socket peer, or -1.
func peerUID(r *http.Request) int {
	if v, ok := r.Context().Value(ctxKey{}).(int); ok {
		return v
	}
	return -1
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
	r.Handle("/metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	r.Post("/v1/sessions", s.open)
	r.Post("/v1/sessions/{id}/next", s.withSession(s.next))
	r.Post("/v1/sessions/{id}/release", s.withSession(s.release))
	r.Get("/v1/sessions/{id}/state", s.withSession(s.state))
	r.Delete("/v1/sessions/{id}", s.withSession(s.close))
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
		return fmt.Errorf("reading request body: %w", err)
	}
	if len(b) > maxBody {
		return fmt.Errorf("request body larger than %d bytes", maxBody)
	}
	dec := msgpack.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields(true)
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("malformed msgpack request: %w", err)
	}
	return nil
}

func newID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *Server) open(w http.ResponseWriter, r *http.Request) {
	var req OpenRequest
	if err := decode(r, &req); err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	m, ok := s.cfg.Datasets[req.Dataset]
	if !ok {
		writeErr(w, http.StatusNotFound, fmt.Sprintf("unknown dataset %q (registered: %s)", req.Dataset, strings.Join(s.datasetNames(), ", ")))
		return
	}
	if req.Backend == "" {
		req.Backend = "file"
	}
	if req.Backend != "file" && req.Backend != "gds" && req.Backend != "bam" {
		writeErr(w, http.StatusBadRequest, fmt.Sprintf("unknown backend %q (want file, gds or bam)", req.Backend))
		return
	}
	if req.PrefetchQueueDepth == 0 {
		req.PrefetchQueueDepth = 2
	}
	if req.PrefetchQueueDepth < 0 || req.PrefetchQueueDepth > 64 {
		writeErr(w, http.StatusBadRequest, fmt.Sprintf("prefetch_queue_depth %d not in [1, 64]", req.PrefetchQueueDepth))
		return
	}
	if req.Hold == 0 {
		req.Hold = req.PrefetchQueueDepth + 2
	}
	if req.Hold < 1 || req.Hold > 64 {
		writeErr(w, http.StatusBadRequest, fmt.Sprintf("hold %d not in [1, 64]", req.Hold))
		return
	}
	if req.BatchSize < 1 || req.BatchSize > loader.MaxBatchSize {
		writeErr(w, http.StatusBadRequest, fmt.Sprintf("batch_size %d not in [1, %d]", req.BatchSize, loader.MaxBatchSize))
		return
	}
	slots := req.PrefetchQueueDepth + req.Hold
	if need := loader.SlotBytes(m, req.BatchSize) * int64(slots); need > s.cfg.MaxSessionBytes {
		writeErr(w, http.StatusBadRequest, fmt.Sprintf("batch_size %d with %d slots needs %d bytes of batch memory, over the daemon's limit of %d", req.BatchSize, slots, need, s.cfg.MaxSessionBytes))
		return
	}
	s.mu.Lock()
	n := len(s.sessions)
	s.mu.Unlock()
	if n >= s.cfg.MaxSessions {
		writeErr(w, http.StatusTooManyRequests, fmt.Sprintf("%d sessions open, the daemon's limit", n))
		return
	}
	uid := peerUID(r)
	l, err := loader.New(context.Background(), m, loader.Options{
		BatchSize: req.BatchSize, ShardID: req.ShardID, NumShards: req.NumShards, RandomShuffle: req.RandomShuffle,
		Seed: req.Seed, PadLastBatch: req.PadLastBatch, StickToShard: req.StickToShard,
		PrefetchQueueDepth: req.PrefetchQueueDepth, Slots: slots, Memory: loader.MemoryKind(req.Memory),
		ShmDir: s.cfg.ShmDir, Backend: req.Backend, State: req.State, Logger: s.log, SkipErrors: true,
	})
	if err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, loader.ErrOptions) || errors.Is(err, loader.ErrNoCUDA) {
			code = http.StatusBadRequest
		} else if errors.Is(err, bmap.ErrStale) || errors.Is(err, loader.ErrDevice) {
			code = http.StatusConflict
		}
		writeErr(w, code, err.Error())
		return
	}
	ring := l.Ring()
	if uid >= 0 { // only the client's uid may read the batch memory
		err := unix.Fchown(ring.Fd(), uid, -1)
		if err == nil {
			err = unix.Fchmod(ring.Fd(), 0o400)
		}
		if err != nil { // the memory stays the daemon's alone: safe, but the client cannot map it
			s.log.Warn("serve: cannot hand session memory to the client", "shm", ring.Path(), "uid", uid, "err", err)
		}
	}
	ss := &session{id: newID(), dataset: req.Dataset, backend: req.Backend, uid: uid, l: l, held: map[int]*loader.Batch{}, slots: slots}
	ss.lastUsed.Store(time.Now().UnixNano())
	s.mu.Lock()
	s.sessions[ss.id] = ss
	s.mu.Unlock()
	s.metrics.sessions.Inc()
	st := l.State()
	s.log.Info("serve: session opened", "session", ss.id, "dataset", req.Dataset, "backend", req.Backend, "uid", uid,
		"batch_size", req.BatchSize, "shard", req.ShardID, "num_shards", req.NumShards, "shm", ring.Path())
	writeMsg(w, http.StatusOK, OpenResponse{ID: ss.id, Shm: ring.Path(), ShmSize: ring.Size(), Slots: slots,
		Epoch: st.Epoch, EpochBatches: l.Sampling().EpochBatches(st.Epoch)})
}

func (s *Server) datasetNames() []string {
	var names []string
	for n := range s.cfg.Datasets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// withSession resolves {id}, checks the caller owns it, and serializes
// requests to it.
func (s *Server) withSession(h func(http.ResponseWriter, *http.Request, *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := chi.URLParam(r, "id")
		s.mu.Lock()
		ss := s.sessions[id]
		s.mu.Unlock()
		if ss == nil {
			writeErr(w, http.StatusNotFound, fmt.Sprintf("unknown session %q (closed, reaped after %s idle, or never opened)", id, s.cfg.SessionTimeout))
			return
		}
		if uid := peerUID(r); ss.uid >= 0 && uid != ss.uid {
			writeErr(w, http.StatusForbidden, fmt.Sprintf("session %s belongs to another user", id))
			return
		}
		ss.mu.Lock()
		defer ss.mu.Unlock()
		if ss.closed {
			writeErr(w, http.StatusNotFound, fmt.Sprintf("unknown session %q (closed)", id))
			return
		}
		ss.lastUsed.Store(time.Now().UnixNano())
		defer ss.lastUsed.Store(time.Now().UnixNano())
		h(w, r, ss)
	}
}

func (s *Server) next(w http.ResponseWriter, r *http.Request, ss *session) {
	if r.ContentLength != 0 {
		var req NextRequest
		if err := decode(r, &req); err != nil {
			writeErr(w, http.StatusBadRequest, err.Error())
			return
		}
		for _, slot := range req.Release {
			if err := ss.releaseSlot(slot); err != nil {
				writeErr(w, http.StatusBadRequest, err.Error())
				return
			}
		}
	}
	if len(ss.held) >= ss.slots {
		writeErr(w, http.StatusConflict, fmt.Sprintf("all %d batch slots are held: release batches before asking for more", ss.slots))
		return
	}
	b, err := ss.l.Next(r.Context())
	if errors.Is(err, io.EOF) {
		st := ss.l.State()
		writeMsg(w, http.StatusOK, NextResponse{EndOfEpoch: true, Epoch: st.Epoch, EpochBatches: ss.l.Sampling().EpochBatches(st.Epoch)})
		return
	}
	if err != nil {
		s.metrics.errors.WithLabelValues(ss.dataset, ss.backend, ss.id).Inc()
		code := http.StatusInternalServerError
		if errors.Is(err, context.Canceled) {
			code = 499 // client went away
		}
		writeErr(w, code, err.Error())
		return
	}
	ss.held[b.Slot] = b
	resp := NextResponse{Epoch: b.Epoch, Iteration: b.Iteration, EpochBatches: ss.l.Sampling().EpochBatches(b.Epoch), Slot: b.Slot,
		Offsets: b.Offsets, Lengths: b.Lengths, Labels: b.Labels, Indices: b.Indices}
	var bytes int64
	for _, n := range b.Lengths {
		bytes += n
	}
	for _, e := range b.Errors {
		resp.Errors = append(resp.Errors, e.Error())
	}
	s.metrics.observe(ss, b, bytes)
	writeMsg(w, http.StatusOK, resp)
}

func (s *Server) release(w http.ResponseWriter, r *http.Request, ss *session) {
	var req ReleaseRequest
	if err := decode(r, &req); err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := ss.releaseSlot(req.Slot); err != nil {
		writeErr(w, http.StatusBadRequest, err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// releaseSlot gives back the batch the client holds in slot; ss.mu held.
func (ss *session) releaseSlot(slot int) error {
	b, ok := ss.held[slot]
	if !ok {
		return fmt.Errorf("slot %d holds no batch of this session", slot)
	}
	delete(ss.held, slot)
	b.Release()
	return nil
}

func (s *Server) state(w http.ResponseWriter, _ *http.Request, ss *session) {
	writeMsg(w, http.StatusOK, ss.l.State())
}

func (s *Server) close(w http.ResponseWriter, _ *http.Request, ss *session) {
	s.closeSession(ss, "closed by client")
	w.WriteHeader(http.StatusNoContent)
}

// closeSession frees a session; ss.mu must be held.
func (s *Server) closeSession(ss *session, why string) {
	if ss.closed {
		return
	}
	ss.closed = true
	s.mu.Lock()
	delete(s.sessions, ss.id)
	s.mu.Unlock()
	if err := ss.l.Close(); err != nil {
		s.log.Warn("serve: closing session", "session", ss.id, "err", err)
	}
	s.metrics.forget(ss)
	s.metrics.sessions.Dec()
	s.log.Info("serve: session ended", "session", ss.id, "why", why)
}

// reap closes sessions idle longer than the timeout.
func (s *Server) reap(now time.Time) {
	s.mu.Lock()
	var idle []*session
	for _, ss := range s.sessions {
		if now.Sub(time.Unix(0, ss.lastUsed.Load())) > s.cfg.SessionTimeout {
			idle = append(idle, ss)
		}
	}
	s.mu.Unlock()
	for _, ss := range idle {
		if ss.mu.TryLock() { // a session busy in a request is not idle
			s.closeSession(ss, fmt.Sprintf("idle for more than %s", s.cfg.SessionTimeout))
			ss.mu.Unlock()
		}
	}
}

// CloseAll ends every session.
func (s *Server) CloseAll() {
	s.mu.Lock()
	all := make([]*session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		all = append(all, ss)
	}
	s.mu.Unlock()
	for _, ss := range all {
		ss.mu.Lock()
		s.closeSession(ss, "daemon shutting down")
		ss.mu.Unlock()
	}
}

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
	tick := time.NewTicker(max(s.cfg.SessionTimeout/4, 10*time.Millisecond))
	defer tick.Stop()
	s.log.Info("serve: listening", "socket", socketPath, "tcp", tcpAddr, "datasets", strings.Join(s.datasetNames(), ","))
	for {
		select {
		case now := <-tick.C:
			s.reap(now)
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
