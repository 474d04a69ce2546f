// SPDX-License-Identifier: Apache-2.0

// Package serve is loaderd's transport: HTTP and msgpack on a unix socket, optionally loopback TCP.
// Batch bytes travel through shared memory, passed to the owner as a descriptor.
// Clients name a dataset and a backend, never a path, device or byte range.
// A session belongs to the uid that opened it; idle sessions are reaped.
// The messages are package wire's; convert.go turns them into the session core's types.
package serve

import (
	"bufio"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/session"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/loader"
)

// Config configures a Server: the session core's configuration.
type Config = session.Config

// Server serves loader sessions over HTTP: a thin adapter over
// session.Manager.
type Server struct {
	mgr    *session.Manager
	log    *slog.Logger
	notify notifier // systemd's $NOTIFY_SOCKET (notify.go)
	// The hijacked connections' deadlines (Run sets them from its Listen;
	// zero: none).
	writeTimeout, streamIdle time.Duration
	// conns are the connection limits Run listens with (nil before Run,
	// or without it): /v1/status tells how many are used.
	conns *connCaps
	// daemon is this daemon's side of every request (version.go).
	daemon wire.Side
}

// New makes a server. Under systemd (Type=notify) it tells the state
// changes to $NOTIFY_SOCKET (notify.go).
func New(cfg Config) *Server {
	mgr := session.NewManager(cfg)
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Server{mgr: mgr, log: log, notify: notifier{addr: os.Getenv("NOTIFY_SOCKET")}, daemon: daemonSide(cfg.Release)}
}

// sdNotify tells systemd a state change; a failure is logged, never fatal.
func (s *Server) sdNotify(state string) {
	if err := s.notify.send(state); err != nil {
		s.log.Warn("serve: telling systemd the daemon's state", "state", state, "err", err)
	}
}

// status is the daemon's one-line state for systemctl status.
func (s *Server) status() string {
	return "serving datasets " + strings.Join(s.mgr.DatasetNames(), ", ")
}

// Reload reads every dataset's map file again without dropping sessions.
// A map that fails to load keeps the old one. It tells systemd RELOADING=1, then READY=1.
func (s *Server) Reload() ([]session.Reloaded, error) {
	s.sdNotify(reloading())
	res, err := s.mgr.Reload()
	defer s.sdNotify("READY=1\nSTATUS=" + s.status())
	if err != nil {
		s.log.Error("serve: reload", "err", err)
		return nil, err
	}
	failed := 0
	for _, r := range res {
		if r.Outcome == session.ReloadFailed {
			failed++
		}
	}
	s.log.Info("serve: reloaded", "datasets", len(res), "failed", failed)
	return res, nil
}

type ctxKey struct{}

// peer is what a connection tells of its client.
type peer struct {
	caller session.Caller // from SO_PEERCRED; over TCP, the TCP principal
	tcp    bool
}

// caller returns the request's client (uid -1 when unknown).
func caller(r *http.Request) session.Caller {
	if p, ok := r.Context().Value(ctxKey{}).(peer); ok {
		return p.caller
	}
	return session.Caller{UID: -1, GID: -1}
}

// connContext records a unix peer's credentials from SO_PEERCRED and SO_PEERGROUPS.
// A TCP peer is tcpUser, the TCP principal.
func connContext(tcpUser session.Caller) func(ctx context.Context, c net.Conn) context.Context {
	return func(ctx context.Context, c net.Conn) context.Context {
		p := peer{caller: session.Caller{UID: -1, GID: -1}}
		switch c := c.(type) {
		case *unixConn:
			p.caller = session.Caller{UID: int(c.cred.UID), GID: int(c.cred.GID), Groups: c.cred.Groups}
		case *net.UnixConn:
			if cr, err := peerCred(c); err == nil {
				p.caller = session.Caller{UID: int(cr.UID), GID: int(cr.GID), Groups: cr.Groups}
			}
		default:
			p.tcp, p.caller = true, tcpUser
		}
		return context.WithValue(ctx, ctxKey{}, p)
	}
}

// requireToken refuses TCP requests without "Authorization: Bearer TOKEN";
// unix-socket requests pass (the socket's mode and group guard them).
func requireToken(token string, next http.Handler) http.Handler {
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p, _ := r.Context().Value(ctxKey{}).(peer); p.tcp && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			writeErr(w, http.StatusUnauthorized, "loopback TCP requests need the daemon's token: Authorization: Bearer TOKEN (see --tcp-token)")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Handler returns the HTTP API.
func (s *Server) Handler() http.Handler {
	r := chi.NewRouter()
	r.Use(negotiate, s.versioned)
	r.Get("/healthz", healthz)
	// No session ids in the metrics; a dataset's series only to its readers.
	r.Handle("/metrics", http.HandlerFunc(s.metrics))
	r.Get("/v1/backends", s.backends)
	r.Get("/v1/datasets", s.datasets)
	r.Get("/v1/status", s.statusOf)
	r.Post("/v1/reload", s.reload)
	r.Post("/v1/sessions", s.open)
	r.Post("/v1/sessions/{id}/next", s.next)
	r.Post("/v1/sessions/{id}/release", s.release)
	r.Post("/v1/sessions/{id}/memory", s.memory)
	r.Post("/v1/sessions/{id}/stream", s.stream)
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
	writeMsg(w, code, wire.ErrorResponse{Error: msg})
}

// fail writes err with the status its sentinel maps to. After a body too
// large the connection closes: the rest of it is not read.
func fail(w http.ResponseWriter, err error) {
	if errors.Is(err, errBodyTooLarge) {
		w.Header().Set("Connection", "close")
	}
	writeMsg(w, status(err), wire.ErrorResponse{Error: err.Error(), Code: code(err)})
}

// writeMsg writes v in msgpack, or in JSON where the request asked for it
// (negotiate).
func writeMsg(w http.ResponseWriter, code int, v any) {
	encode, ctype := msgpack.Marshal, "application/msgpack"
	if _, ok := w.(jsonReply); ok {
		encode, ctype = wire.MarshalJSON, "application/json"
	}
	b, err := encode(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(err.Error())
	}
	w.Header().Set("Content-Type", ctype)
	w.WriteHeader(code)
	w.Write(b)
}

// errBodyTooLarge is wrapped for a body past its limit; fail then closes the connection.
var errBodyTooLarge = fmt.Errorf("%w: request body too large", wire.ErrMalformed)

// decode reads a body of at most limit bytes and decodes it into v.
// A Content-Length past limit is refused unread. Errors wrap wire.ErrMalformed.
func decode(r *http.Request, v any, limit int) error {
	if r.ContentLength > int64(limit) {
		return fmt.Errorf("%w: %d bytes, at most %d", errBodyTooLarge, r.ContentLength, limit)
	}
	var b []byte
	var err error
	if r.ContentLength >= 0 {
		b = make([]byte, r.ContentLength)
		_, err = io.ReadFull(r.Body, b)
	} else {
		b, err = readUpTo(r.Body, limit+1)
	}
	if err != nil {
		return fmt.Errorf("%w: reading request body: %w", wire.ErrMalformed, err)
	}
	if len(b) > limit {
		return fmt.Errorf("%w: more than %d bytes", errBodyTooLarge, limit)
	}
	if err := wire.Decode(b, v); err != nil {
		return versionError(r, err)
	}
	return nil
}

// readUpTo reads rd to its end or to n bytes; its buffer doubles from 512, never past n.
func readUpTo(rd io.Reader, n int) ([]byte, error) {
	b := make([]byte, 0, min(512, n))
	for len(b) < n {
		if len(b) == cap(b) {
			b = append(make([]byte, 0, min(2*cap(b), n)), b...)
		}
		k, err := rd.Read(b[len(b):cap(b)])
		b = b[:len(b)+k]
		if errors.Is(err, io.EOF) {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
	return b, nil
}

// decodePosition decodes an optional small body into v and returns its position, nil if none.
func decodePosition(r *http.Request, v any, epoch, iteration **int) (*session.Position, error) {
	if r.ContentLength != 0 {
		if err := decode(r, v, wire.MaxSmallBody); err != nil {
			return nil, err
		}
	}
	return position(*epoch, *iteration)
}

func (s *Server) backends(w http.ResponseWriter, _ *http.Request) {
	writeMsg(w, http.StatusOK, wire.BackendsResponse{Default: loader.DefaultBackend, Auto: loader.AutoBackend, PrefetchQueueDepth: loader.DefaultPrefetchQueueDepth, Backends: loader.Backends()})
}

// datasets describes every registered dataset: counts only, no session
// and no file (anyone who may connect asks).
func (s *Server) datasets(w http.ResponseWriter, r *http.Request) {
	writeMsg(w, http.StatusOK, datasetsResponse(s.mgr.Datasets(r.Context(), caller(r))))
}

// statusOf tells the caller what the daemon serves and holds.
// Root on the unix socket sees every session; anyone else its own.
func (s *Server) statusOf(w http.ResponseWriter, r *http.Request) {
	var conns *wire.Budget
	if s.conns != nil {
		s.conns.counted.mu.Lock()
		conns = &wire.Budget{Name: "connections", Used: int64(s.conns.counted.n), Limit: int64(s.conns.total), Source: "--max-conns"}
		s.conns.counted.mu.Unlock()
	}
	writeMsg(w, http.StatusOK, statusResponse(s.mgr.Status(r.Context(), caller(r)), conns))
}

// metrics serves the Prometheus metrics as the caller may see them.
// A dataset's series go only to a caller who may read it; daemon-wide series to all.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	readable := s.mgr.Readable(r.Context(), caller(r))
	g := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		mfs, err := s.mgr.Registry().Gather()
		for _, mf := range mfs {
			mf.Metric = slices.DeleteFunc(mf.Metric, func(m *dto.Metric) bool {
				for _, l := range m.GetLabel() {
					if l.GetName() == "dataset" && !readable(l.GetValue()) {
						return true
					}
				}
				return false
			})
		}
		return mfs, err
	})
	promhttp.HandlerFor(g, promhttp.HandlerOpts{}).ServeHTTP(w, r)
}

// reload reads the datasets' maps again; only root on the unix socket may ask.
func (s *Server) reload(w http.ResponseWriter, r *http.Request) {
	if c := caller(r); c.UID != 0 || c.TCP {
		writeErr(w, http.StatusForbidden, "reload is for root on the unix socket (loaderd reload, or SIGHUP)")
		return
	}
	res, err := s.Reload()
	switch {
	case errors.Is(err, session.ErrNoMapFiles):
		writeErr(w, http.StatusConflict, err.Error())
	case err != nil:
		writeErr(w, http.StatusInternalServerError, err.Error())
	default:
		writeMsg(w, http.StatusOK, reloadResponse(res))
	}
}

func (s *Server) open(w http.ResponseWriter, r *http.Request) {
	var req wire.OpenRequest
	if err := decode(r, &req, wire.MaxOpenBody); err != nil {
		fail(w, err)
		return
	}
	o, err := s.mgr.Open(r.Context(), caller(r), openParams(req))
	if err != nil {
		fail(w, err)
		return
	}
	writeMsg(w, http.StatusOK, openResponse(o))
}

// switchProtocols takes over the connection and answers 101; ok is false when it is lost.
func switchProtocols(w http.ResponseWriter, protocol string) (net.Conn, *bufio.ReadWriter, bool) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		writeErr(w, http.StatusInternalServerError, fmt.Sprintf("cannot take over the connection for %s: %v", protocol, err))
		return nil, nil, false
	}
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: %s\r\nConnection: Upgrade\r\n", protocol)
	writeVersionHeaders(w, func(k, v string) { fmt.Fprintf(brw, "%s: %s\r\n", k, v) })
	brw.WriteString("\r\n")
	if err := brw.Flush(); err != nil {
		conn.Close()
		return nil, nil, false
	}
	return conn, brw, true
}

// memory hands the session's batch memory to its owner as a file
// descriptor (see wire.MemoryUpgrade).
func (s *Server) memory(w http.ResponseWriter, r *http.Request) {
	id, c := chi.URLParam(r, "id"), caller(r)
	if !strings.EqualFold(r.Header.Get("Upgrade"), wire.MemoryUpgrade) {
		writeErr(w, http.StatusBadRequest, fmt.Sprintf("batch memory needs the header Upgrade: %s", wire.MemoryUpgrade))
		return
	}
	desc, f, err := s.mgr.Memory(c, id)
	if err != nil {
		fail(w, err)
		return
	}
	msg, err := wire.AppendFrame(nil, wire.MemoryResponse{Memory: desc})
	if err != nil {
		f.Close()
		writeErr(w, http.StatusInternalServerError, err.Error())
		return
	}
	conn, _, ok := switchProtocols(w, wire.MemoryUpgrade)
	if !ok {
		f.Close()
		return
	}
	s.deadlines(conn)
	// Manager.Memory refuses TCP callers, so conn is a unix one.
	if uc, ok := conn.(interface {
		WriteMsgUnix(b, oob []byte, addr *net.UnixAddr) (n, oobn int, err error)
	}); ok {
		if _, _, err := uc.WriteMsgUnix(msg, unix.UnixRights(int(f.Fd())), nil); err != nil {
			s.log.Log(context.Background(), closeLevel(err), "serve: passing batch memory", "session", id, "err", err)
		}
	}
	// The daemon's copy of the descriptor goes before the connection does:
	// a client that has read to the end finds none left here.
	f.Close()
	conn.Close()
}

func (s *Server) next(w http.ResponseWriter, r *http.Request) {
	var req wire.NextRequest
	at, err := decodePosition(r, &req, &req.Epoch, &req.Iteration)
	if err != nil {
		fail(w, err)
		return
	}
	d, err := s.mgr.Next(r.Context(), caller(r), chi.URLParam(r, "id"), req.Release, at)
	if err != nil {
		fail(w, err)
		return
	}
	writeMsg(w, http.StatusOK, nextResponse(d))
}

func (s *Server) release(w http.ResponseWriter, r *http.Request) {
	var req wire.ReleaseRequest
	if err := decode(r, &req, wire.MaxSmallBody); err != nil {
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

// Defaults of Listen's limits: a zero field takes its default.
const (
	// DefaultReadTimeout bounds reading a request, headers and body
	// (bodies are small: at most 64 KiB): a slow body is cut.
	DefaultReadTimeout = 30 * time.Second
	// DefaultWriteTimeout bounds a response from the end of its request, and every frame written.
	DefaultWriteTimeout = 2 * time.Minute
	// DefaultIdleTimeout closes a keep-alive connection idle between
	// requests (the client reconnects).
	DefaultIdleTimeout = 2 * time.Minute
	// DefaultStreamIdleTimeout closes a stream idle both ways this long.
	// Run makes it no less than the session timeout.
	DefaultStreamIdleTimeout = 10 * time.Minute
	// DefaultMaxConnsPerUID bounds one uid's connections; TCP clients count as one uid.
	// A LoaderSource holds two and briefly three, so every session of a uid fits.
	DefaultMaxConnsPerUID = 64
	// DefaultRootConns is the connections kept for uid 0 on the unix socket.
	DefaultRootConns = 16
	// fdsPerSession is the descriptors MaxConns's default keeps per session.
	fdsPerSession = 32
	// daemonFDs is what MaxConns's default keeps for the rest of the daemon.
	daemonFDs = 96 + refusals
	// DefaultTCPUser is the user TCP callers are judged as.
	DefaultTCPUser = "nobody"
	// headerTimeout bounds reading a request's headers.
	headerTimeout = 10 * time.Second
)

// Listen says where and how the daemon listens.
type Listen struct {
	Socket string      // unix socket path (required)
	Mode   os.FileMode // the socket's mode; 0 means 0660: owner and group may connect
	Group  string      // the socket's group, a name or a gid; "" keeps the daemon's
	TCP    string      // also listen on this loopback address ("" for none)
	Token  string      // the bearer token every TCP request must carry (required with TCP)
	// TCPUser is the user, by name or uid, TCP callers are judged as and whose sessions they own.
	// TCP and unix-socket callers never reach each other's sessions.
	TCPUser string
	// MaxConnsPerUID bounds one uid's connections; past it 429. Default DefaultMaxConnsPerUID.
	MaxConnsPerUID int
	// MaxConns bounds all open connections, below the descriptor limit so accept never fails.
	// Past it a connection is answered 429 and closed.
	MaxConns, RootConns int
	// Timeouts: DefaultReadTimeout, DefaultWriteTimeout,
	// DefaultIdleTimeout, DefaultStreamIdleTimeout when zero.
	ReadTimeout, WriteTimeout, IdleTimeout, StreamIdleTimeout time.Duration
}

// withDefaults fills in l's zero fields.
func (l Listen) withDefaults(sessionTimeout time.Duration) Listen {
	if l.Mode == 0 {
		l.Mode = 0o660
	}
	if l.TCPUser == "" {
		l.TCPUser = DefaultTCPUser
	}
	if l.MaxConnsPerUID == 0 {
		l.MaxConnsPerUID = DefaultMaxConnsPerUID
	}
	switch l.RootConns {
	case 0:
		l.RootConns = DefaultRootConns
	case -1:
		l.RootConns = 0
	}
	if l.ReadTimeout == 0 {
		l.ReadTimeout = DefaultReadTimeout
	}
	if l.WriteTimeout == 0 {
		l.WriteTimeout = DefaultWriteTimeout
	}
	if l.IdleTimeout == 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	if l.StreamIdleTimeout == 0 {
		l.StreamIdleTimeout = DefaultStreamIdleTimeout
	}
	l.StreamIdleTimeout = max(l.StreamIdleTimeout, sessionTimeout)
	return l
}

// maxConnsFor is the default total of connections: the descriptors left for them.
// It is at least rootConns+1, so one other user can connect.
func maxConnsFor(nofile uint64, open, sessions, rootConns int) int {
	left := int64(min(nofile, 1<<30)) - int64(open) - int64(sessions)*fdsPerSession - daemonFDs
	return int(max(left, int64(rootConns)+1))
}

// openFDs counts the process's open descriptors.
func openFDs() (int, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, fmt.Errorf("counting open descriptors: %w", err)
	}
	return len(ents), nil
}

// connCapsFor returns l's connection limits: MaxConns, or its default
// from the fd limit now, for a daemon of sessions sessions.
func connCapsFor(l Listen, sessions int) (connCaps, error) {
	caps := connCaps{perPeer: l.MaxConnsPerUID, total: l.MaxConns, rootOnly: l.RootConns, counted: &totalConns{}}
	if caps.total == 0 {
		var lim unix.Rlimit
		if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			return caps, fmt.Errorf("serve: RLIMIT_NOFILE: %w", err)
		}
		open, err := openFDs()
		if err != nil {
			return caps, fmt.Errorf("serve: the default of --max-conns: %w", err)
		}
		caps.total = maxConnsFor(lim.Cur, open, sessions, caps.rootOnly)
	}
	if caps.rootOnly >= caps.total {
		return caps, fmt.Errorf("serve: %d connections kept for root, but only %d allowed in all (--max-conns): %w", caps.rootOnly, caps.total, ErrConnCaps)
	}
	return caps, nil
}

// lookupUser resolves a user name or numeric uid to the caller it stands
// for: uid, primary gid and groups from the user database.
func lookupUser(name string) (session.Caller, error) {
	u, err := user.Lookup(name)
	if err != nil {
		if u, err = user.LookupId(name); err != nil {
			return session.Caller{}, err
		}
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return session.Caller{}, fmt.Errorf("uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return session.Caller{}, fmt.Errorf("gid %q: %w", u.Gid, err)
	}
	c := session.Caller{UID: uid, GID: gid, TCP: true}
	if gs, err := u.GroupIds(); err == nil {
		for _, g := range gs {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				c.Groups = append(c.Groups, uint32(n))
			}
		}
	}
	return c, nil
}

// Run serves until ctx is done, then ends every session and removes the socket.
// The socket gets l.Mode and l.Group; the loopback TCP listener requires l.Token.
// Connections are bounded in time, per uid and in total, some kept for root.
func (s *Server) Run(ctx context.Context, l Listen) error {
	defer s.mgr.Stop()
	l = l.withDefaults(s.mgr.Timeout())
	s.writeTimeout, s.streamIdle = l.WriteTimeout, l.StreamIdleTimeout
	gid := -1
	if l.Group != "" {
		g, err := lookupGroup(l.Group)
		if err != nil {
			return fmt.Errorf("serve: socket group %q: %w", l.Group, err)
		}
		gid = g
	}
	if l.TCP != "" {
		host, _, err := net.SplitHostPort(l.TCP)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			return fmt.Errorf("serve: TCP address %q: only loopback addresses (127.0.0.1:PORT, [::1]:PORT)", l.TCP)
		}
		if l.Token == "" {
			return fmt.Errorf("serve: TCP address %s: %w", l.TCP, ErrNoToken)
		}
	}
	tcpUser, err := lookupUser(l.TCPUser)
	if err != nil {
		if l.TCP != "" {
			return fmt.Errorf("serve: TCP callers' user %q: %w", l.TCPUser, err)
		}
		tcpUser = session.Caller{UID: -1, GID: -1, TCP: true} // no TCP listener: never used
	}
	caps, err := connCapsFor(l, s.mgr.MaxSessions())
	if err != nil {
		return err
	}
	s.conns = &caps
	ln, err := listenUnix(l.Socket, gid, l.Mode)
	if err != nil {
		return err
	}
	defer os.Remove(l.Socket)
	handler := s.Handler()
	if l.TCP != "" {
		handler = requireToken(l.Token, handler)
	}
	// The upgraded connections (stream, memory) leave these deadlines
	// behind when they take over (deadlines).
	srv := &http.Server{Handler: handler, ConnContext: connContext(tcpUser), ReadHeaderTimeout: min(headerTimeout, l.ReadTimeout),
		ReadTimeout: l.ReadTimeout, WriteTimeout: l.WriteTimeout, IdleTimeout: l.IdleTimeout}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(newPeerListener(ln, caps, s.log)) }()
	if l.TCP != "" {
		tl, err := net.Listen("tcp", l.TCP)
		if err != nil {
			srv.Close()
			return fmt.Errorf("serve: listen on %s: %w", l.TCP, err)
		}
		go func() { errc <- srv.Serve(newPeerListener(tl, caps, s.log)) }()
	}
	// The socket accepts connections from here (it listens; Serve takes them).
	s.sdNotify("READY=1\nSTATUS=" + s.status())
	tick := time.NewTicker(max(s.mgr.Timeout()/4, 10*time.Millisecond))
	defer tick.Stop()
	s.log.Info("serve: listening", "socket", l.Socket, "mode", fmt.Sprintf("%04o", l.Mode), "group", l.Group, "tcp", l.TCP,
		"datasets", strings.Join(s.mgr.DatasetNames(), ","), "max_conns_per_uid", l.MaxConnsPerUID, "max_conns", caps.total, "conns_kept_for_root", caps.rootOnly,
		"read_timeout", l.ReadTimeout, "write_timeout", l.WriteTimeout, "idle_timeout", l.IdleTimeout, "stream_idle_timeout", l.StreamIdleTimeout)
	for {
		select {
		case now := <-tick.C:
			s.mgr.Reap(now)
		case err := <-errc:
			return fmt.Errorf("serve: %w", err)
		case <-ctx.Done():
			s.sdNotify("STOPPING=1\nSTATUS=stopping: ending sessions")
			// Sessions first: a waiting next answers at once and holds up no shutdown.
			s.mgr.CloseAll()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			srv.Shutdown(sctx) // stop accepting; let in-flight requests finish
			cancel()
			srv.Close()
			s.log.Info("serve: stopped")
			return nil
		}
	}
}

// lookupGroup resolves a group name or numeric gid.
func lookupGroup(g string) (int, error) {
	if n, err := strconv.Atoi(g); err == nil && n >= 0 {
		return n, nil
	}
	gr, err := user.LookupGroup(g)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(gr.Gid)
}

// listenUnix listens on a unix socket at path with group gid (-1: the daemon's) and mode.
// It binds under a private name and links it to path once ready.
// So a client that sees the path can connect, and the mode is never wrong.
// The link fails if another daemon took path meanwhile.
func listenUnix(path string, gid int, mode os.FileMode) (*net.UnixListener, error) {
	if err := socketDir(filepath.Dir(path)); err != nil {
		return nil, err
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+"~")
	if err := removeStaleSocket(tmp); err != nil {
		return nil, err
	}
	// No access for others from the start: the private name is never
	// reachable by anyone but the daemon's user.
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("serve: listen on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (*net.UnixListener, error) {
		ln.Close()
		os.Remove(tmp)
		return nil, err
	}
	if err := os.Chown(tmp, -1, gid); err != nil {
		return fail(fmt.Errorf("serve: socket %s: chgrp %d: %w", path, gid, err))
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return fail(fmt.Errorf("serve: socket %s: chmod %o: %w", path, mode, err))
	}
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			err = fmt.Errorf("serve: %s is in use by another daemon", path)
		} else {
			err = fmt.Errorf("serve: socket %s: %w", path, err)
		}
		return fail(err)
	}
	os.Remove(tmp)
	return ln, nil
}

// socketDir creates the socket's directory and parents, mode 0755, or names the one to create.
func socketDir(dir string) error {
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("serve: the socket's directory %s: %s is not a directory", dir, d)
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("serve: the socket's directory %s: %w (create it: install -d -m 0755 %s)", dir, err, dir)
		}
		missing = append(missing, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		d := missing[i]
		err := os.Mkdir(d, 0o755)
		if err == nil {
			err = os.Chmod(d, 0o755) // past the umask (systemd's UMask=0077)
		}
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("serve: the socket's directory %s does not exist and cannot be created: %w (create it: install -d -m 0755 %s)", dir, err, dir)
		}
	}
	return nil
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
