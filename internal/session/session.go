// Package session is the daemon's core, independent of any transport:
// it opens loader sessions over registered datasets for a caller, hands
// out batch descriptors, takes releases, saves state, reaps idle sessions,
// and counts it all in Prometheus metrics. It owns the slot budget: how
// many batch slots a session gets for its prefetch depth and the batches
// its client keeps. internal/serve adapts it to HTTP.
package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/fresh"
)

// Limits on what one session may ask for.
const (
	MaxPrefetch     = 64 // prefetch_queue_depth
	MaxReleaseAfter = 64 // release_after
)

// Config configures a Manager.
type Config struct {
	Datasets        map[string]*bmap.Map // registered datasets by name
	ShmDir          string               // where session memory lives; default /dev/shm
	SessionTimeout  time.Duration        // idle sessions are closed after this; default 60s
	MaxSessionBytes int64                // refuse sessions needing more batch memory; default 16 GiB
	MaxSessions     int                  // default 64
	Logger          *slog.Logger
	Faults          *backend.Faults // tests: inject read faults into every session
	// Engines is EnginesPerSession (the default, "" too) or
	// EnginesPerDevice: whether the sessions reading one device share its
	// raw engines. Measured with 8 sessions (README, Figures): the same
	// throughput either way on both test devices; per session keeps a
	// session's queue its own and spreads submissions over cores, per
	// device uses one ring and goroutine per device instead of one each.
	Engines string
}

// Engine scopes (Config.Engines).
const (
	EnginesPerDevice  = "device"  // one raw engine set per device and configuration, shared by its sessions
	EnginesPerSession = "session" // every session has its own
)

// Caller is who makes a request: the uid and gid from SO_PEERCRED, or -1
// when the transport cannot know (loopback TCP).
type Caller struct {
	UID, GID int
}

// OpenParams are a session's options, named as DALI's reader arguments.
type OpenParams struct {
	Dataset            string
	Backend            string         // "" means loader.DefaultBackend
	BackendOptions     map[string]any // the backend's options by name
	BatchSize          int
	ShardID            int
	NumShards          int
	RandomShuffle      bool
	Seed               uint64
	PadLastBatch       bool
	StickToShard       bool
	PrefetchQueueDepth int           // 0 means loader.DefaultPrefetchQueueDepth
	ReleaseAfter       *int          // the client releases a batch after this many later ones; nil means PrefetchQueueDepth+1
	Memory             string        // "" means pinned
	State              *loader.State // resume here
}

// Opened describes a new session.
type Opened struct {
	ID                 string
	Memory             loader.MemoryHandle
	Slots              int
	PrefetchQueueDepth int
	ReleaseAfter       int
	Epoch              int
	EpochBatches       int // batches in the current epoch for this shard
}

// Delivery is one batch's descriptor, or the end of an epoch. Its slices
// are its own.
type Delivery struct {
	EndOfEpoch   bool
	Epoch        int
	Iteration    int
	EpochBatches int
	Slot         int
	Offsets      []int64 // of each sample in the session's memory
	Lengths      []int64
	Labels       []int32
	Indices      []int32
	Failed       []int    // positions whose sample could not be read (their lengths are 0)
	Errors       []string // one message per failed sample, naming its path and the cause
}

// Manager owns the sessions.
type Manager struct {
	cfg      Config
	log      *slog.Logger
	mu       sync.Mutex
	sessions map[string]*session
	metrics  *metrics
	reg      *prometheus.Registry

	guards   map[string]*fresh.Guard // per dataset, shared by its sessions; nil: none could be made
	accessMu sync.Mutex
	verdicts map[verdictKey]verdict          // under accessMu
	checking map[verdictKey]*pendingVerdict  // under accessMu: checks running now
	check    func(*bmap.Map, identity) error // checkAccess; tests replace it
	shared   *backend.Shared                 // engines shared by sessions; nil: per session
}

// pendingVerdict is an access check in progress: callers with the same key
// and generation wait for it instead of repeating it; other keys do not
// wait at all.
type pendingVerdict struct {
	done chan struct{}
	v    verdict // set before done is closed
}

// verdictKey is a cached access verdict's key: a dataset and a caller's
// uid and primary gid.
type verdictKey struct {
	dataset  string
	uid, gid int
}

// verdict is checkAccess's result for a uid, valid while the dataset's
// watch generation is gen.
type verdict struct {
	err error
	gen uint64
}

type session struct {
	id, dataset, backend string
	uid                  int // -1 when unknown
	l                    *loader.Loader
	slots                int
	lastUsed             atomic.Int64

	mu     sync.Mutex // the consumer side: one Next, State, Close or stream step at a time
	closed bool       // under mu

	heldMu sync.Mutex
	held   map[int]*loader.Batch // under heldMu: batches delivered and not released

	streamMu   sync.Mutex
	stopStream context.CancelFunc // under streamMu: set while a stream runs

	metrics sessionMetrics
}

// NewManager makes a manager. For each dataset it checks the filesystem
// and stats every raw sample once, then keeps that current with an inotify
// watch (fresh.Guard), for all sessions: opening a session costs no pass
// over the dataset.
func NewManager(cfg Config) *Manager {
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
	m := &Manager{cfg: cfg, log: cfg.Logger, sessions: map[string]*session{}, reg: prometheus.NewRegistry(),
		guards: map[string]*fresh.Guard{}, verdicts: map[verdictKey]verdict{}, checking: map[verdictKey]*pendingVerdict{}, check: checkAccess}
	if cfg.Engines == EnginesPerDevice {
		m.shared = &backend.Shared{}
	}
	m.metrics = newMetrics(m.reg, m)
	for name, ds := range cfg.Datasets {
		t0 := time.Now()
		g, err := fresh.Open(ds, fresh.Watch, m.log)
		if err != nil {
			m.log.Warn("session: dataset not checked at registration: raw sessions check it at open, access at every open",
				"dataset", name, "err", err)
			continue
		}
		m.guards[name] = g
		m.log.Info("session: dataset registered", "dataset", name, "samples", len(ds.Samples), "freshness", g.Method(),
			"seconds", time.Since(t0).Seconds())
	}
	return m
}

// authorize returns nil if c may read every sample of the dataset through
// the filesystem (see access.go), else an error wrapping ErrForbidden that
// names the dataset and the first path refused. Verdicts are cached per
// (dataset, uid) until the dataset's watch sees a change.
func (m *Manager) authorize(name string, ds *bmap.Map, c Caller) error {
	id := identify(c)
	err := checkAncestors(ds.Root, id)
	if err == nil {
		err = m.verdict(name, ds, c, id).err
	}
	if err != nil {
		who := "a caller of unknown uid (TCP)"
		if c.UID >= 0 {
			who = fmt.Sprintf("uid %d", c.UID)
		}
		return fmt.Errorf("%w: dataset %s: %s may not read it through the filesystem: %w", ErrForbidden, name, who, err)
	}
	return nil
}

// verdict returns the cached verdict for (dataset, uid, gid) while the
// dataset's watch generation is unchanged, else checks access. The check
// (a stat of every file: seconds at ImageNet scale) runs outside the lock:
// concurrent opens by the same caller share one check, and other callers
// and datasets are not held up by it.
func (m *Manager) verdict(name string, ds *bmap.Map, c Caller, id identity) verdict {
	key := verdictKey{name, c.UID, c.GID}
	m.accessMu.Lock()
	g := m.guards[name]
	var gen uint64
	if g != nil {
		g.Poll()
		gen = g.Generation()
		if v, ok := m.verdicts[key]; ok && v.gen == gen {
			m.accessMu.Unlock()
			return v
		}
		if p := m.checking[key]; p != nil && p.v.gen == gen {
			m.accessMu.Unlock()
			<-p.done
			return p.v
		}
	}
	p := &pendingVerdict{done: make(chan struct{}), v: verdict{gen: gen}}
	if g != nil {
		m.checking[key] = p
	}
	m.accessMu.Unlock()

	p.v.err = m.check(ds, id)
	m.accessMu.Lock()
	if g != nil {
		if m.checking[key] == p {
			delete(m.checking, key)
		}
		// A check of an older generation never replaces a newer verdict.
		if old, ok := m.verdicts[key]; !ok || old.gen <= gen {
			m.verdicts[key] = p.v
		}
	}
	m.accessMu.Unlock()
	close(p.done)
	return p.v
}

// Stop ends every session and stops the dataset watches; the manager is
// not used after.
func (m *Manager) Stop() error {
	m.CloseAll()
	var errs []error
	for _, g := range m.guards {
		errs = append(errs, g.Close())
	}
	return errors.Join(errs...)
}

// Registry returns the Prometheus registry holding the metrics.
func (m *Manager) Registry() *prometheus.Registry { return m.reg }

// Timeout returns the idle timeout.
func (m *Manager) Timeout() time.Duration { return m.cfg.SessionTimeout }

// Datasets returns the registered dataset names, sorted.
func (m *Manager) Datasets() []string {
	names := make([]string, 0, len(m.cfg.Datasets))
	for n := range m.cfg.Datasets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func newID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// budget returns the prefetch depth, release_after and slots of a session:
// prefetched batches plus the batches the client holds (the one just
// delivered and release_after earlier ones).
func budget(p OpenParams) (prefetch, releaseAfter, slots int, err error) {
	prefetch = p.PrefetchQueueDepth
	if prefetch == 0 {
		prefetch = loader.DefaultPrefetchQueueDepth
	}
	if prefetch < 1 || prefetch > MaxPrefetch {
		return 0, 0, 0, fmt.Errorf("%w: prefetch_queue_depth %d not in [1, %d]", ErrInvalid, p.PrefetchQueueDepth, MaxPrefetch)
	}
	releaseAfter = prefetch + 1
	if p.ReleaseAfter != nil {
		releaseAfter = *p.ReleaseAfter
	}
	if releaseAfter < 0 || releaseAfter > MaxReleaseAfter {
		return 0, 0, 0, fmt.Errorf("%w: release_after %d not in [0, %d]", ErrInvalid, releaseAfter, MaxReleaseAfter)
	}
	return prefetch, releaseAfter, prefetch + releaseAfter + 1, nil
}

// Open opens a session for c.
func (m *Manager) Open(c Caller, p OpenParams) (Opened, error) {
	ds, ok := m.cfg.Datasets[p.Dataset]
	if !ok {
		return Opened{}, fmt.Errorf("%w: unknown dataset %q (registered: %s)", ErrNotFound, p.Dataset, strings.Join(m.Datasets(), ", "))
	}
	if err := m.authorize(p.Dataset, ds, c); err != nil {
		return Opened{}, err
	}
	if p.Backend == "" {
		p.Backend = loader.DefaultBackend
	}
	if _, err := loader.BackendSpec(p.Backend); err != nil {
		return Opened{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	prefetch, releaseAfter, slots, err := budget(p)
	if err != nil {
		return Opened{}, err
	}
	if p.BatchSize < 1 || p.BatchSize > loader.MaxBatchSize {
		return Opened{}, fmt.Errorf("%w: batch_size %d not in [1, %d]", ErrInvalid, p.BatchSize, loader.MaxBatchSize)
	}
	if need := loader.SlotBytes(ds, p.BatchSize) * int64(slots); need > m.cfg.MaxSessionBytes {
		return Opened{}, fmt.Errorf("%w: batch_size %d with %d slots needs %d bytes of batch memory, over the daemon's limit of %d",
			ErrInvalid, p.BatchSize, slots, need, m.cfg.MaxSessionBytes)
	}
	m.mu.Lock()
	n := len(m.sessions)
	m.mu.Unlock()
	if n >= m.cfg.MaxSessions {
		return Opened{}, fmt.Errorf("%w: %d sessions open, the daemon's limit", ErrLimit, n)
	}
	l, err := loader.New(context.Background(), ds, loader.Options{
		BatchSize: p.BatchSize, ShardID: p.ShardID, NumShards: p.NumShards, RandomShuffle: p.RandomShuffle,
		Seed: p.Seed, PadLastBatch: p.PadLastBatch, StickToShard: p.StickToShard,
		PrefetchQueueDepth: prefetch, Slots: slots, Memory: loader.MemoryKind(p.Memory),
		ShmDir: m.cfg.ShmDir, Backend: p.Backend, BackendOptions: p.BackendOptions, State: p.State, Logger: m.log, SkipErrors: true, Faults: m.cfg.Faults, Guard: m.guards[p.Dataset],
		Shared: m.shared,
	})
	if err != nil {
		switch {
		case errors.Is(err, loader.ErrOptions), errors.Is(err, loader.ErrNoCUDA):
			return Opened{}, fmt.Errorf("%w: dataset %s: %w", ErrInvalid, p.Dataset, err)
		case errors.Is(err, bmap.ErrStale), errors.Is(err, backend.ErrDevice):
			return Opened{}, fmt.Errorf("%w: dataset %s: %w", ErrConflict, p.Dataset, err)
		}
		return Opened{}, fmt.Errorf("session: dataset %s: %w", p.Dataset, err)
	}
	mem := l.Memory()
	if c.UID >= 0 { // only the client's uid may read the batch memory
		if err := mem.Share(c.UID); err != nil { // the memory stays the daemon's alone: safe, but the client cannot map it
			m.log.Warn("session: cannot hand session memory to the client", "uid", c.UID, "err", err)
		}
	}
	ss := &session{id: newID(), dataset: p.Dataset, backend: p.Backend, uid: c.UID, l: l, held: map[int]*loader.Batch{}, slots: slots}
	ss.metrics = m.metrics.forSession(ss.dataset, ss.backend, ss.id)
	ss.lastUsed.Store(time.Now().UnixNano())
	m.mu.Lock()
	m.sessions[ss.id] = ss
	m.mu.Unlock()
	m.metrics.sessions.Inc()
	st := l.State()
	h := mem.Handle()
	m.log.Info("session: opened", "session", ss.id, "dataset", p.Dataset, "backend", p.Backend, "uid", c.UID,
		"batch_size", p.BatchSize, "shard", p.ShardID, "num_shards", p.NumShards, "slots", slots, "shm", h.Path)
	return Opened{ID: ss.id, Memory: h, Slots: slots, PrefetchQueueDepth: prefetch, ReleaseAfter: releaseAfter,
		Epoch: st.Epoch, EpochBatches: l.Sampling().EpochBatches(st.Epoch)}, nil
}

// lookup resolves a session and checks c owns it.
func (m *Manager) lookup(c Caller, id string) (*session, error) {
	m.mu.Lock()
	ss := m.sessions[id]
	m.mu.Unlock()
	if ss == nil {
		return nil, fmt.Errorf("%w: unknown session %q (closed, reaped after %s idle, or never opened)", ErrNotFound, id, m.cfg.SessionTimeout)
	}
	if ss.uid >= 0 && c.UID != ss.uid {
		return nil, fmt.Errorf("%w: session %s belongs to another user", ErrForbidden, id)
	}
	return ss, nil
}

// with resolves a session, checks c owns it, and runs fn holding its
// consumer lock.
func (m *Manager) with(c Caller, id string, fn func(*session) error) error {
	ss, err := m.lookup(c, id)
	if err != nil {
		return err
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		return fmt.Errorf("%w: unknown session %q (closed)", ErrNotFound, id)
	}
	ss.touch()
	defer ss.touch()
	return fn(ss)
}

func (ss *session) touch() { ss.lastUsed.Store(time.Now().UnixNano()) }

// Check returns nil if the session exists and belongs to c.
func (m *Manager) Check(c Caller, id string) error {
	_, err := m.lookup(c, id)
	return err
}

// Position names a batch: its epoch and its iteration within the epoch,
// as DALI's BatchInfo does.
type Position struct {
	Epoch, Iteration int
}

// Next releases the given slots, then returns the session's next batch
// (waiting for its reads) or the end of the epoch. With at, it returns
// that batch instead (the end of the epoch when it has no such batch), and
// the session goes on from there. A client that holds every slot gets
// ErrBusy; so does one whose session is streaming.
func (m *Manager) Next(ctx context.Context, c Caller, id string, release []int, at *Position) (Delivery, error) {
	var d Delivery
	err := m.with(c, id, func(ss *session) error {
		if ss.streaming() {
			return fmt.Errorf("%w: session %s is streaming its batches", ErrBusy, ss.id)
		}
		for _, slot := range release {
			if err := ss.release(slot); err != nil {
				return err
			}
		}
		ss.heldMu.Lock()
		n := len(ss.held)
		ss.heldMu.Unlock()
		if n >= ss.slots {
			return fmt.Errorf("%w: all %d batch slots of session %s are held: release batches before asking for more", ErrBusy, ss.slots, ss.id)
		}
		var err error
		d, err = m.deliver(ctx, ss, at)
		return err
	})
	return d, err
}

// deliver takes the session's next batch (or the one at at) and records it
// as held; ss.mu held.
func (m *Manager) deliver(ctx context.Context, ss *session, at *Position) (Delivery, error) {
	var b *loader.Batch
	var err error
	if at != nil {
		b, err = ss.l.NextAt(ctx, at.Epoch, at.Iteration)
	} else {
		b, err = ss.l.Next(ctx)
	}
	if errors.Is(err, io.EOF) {
		st := ss.l.State()
		return Delivery{EndOfEpoch: true, Epoch: st.Epoch, EpochBatches: ss.l.Sampling().EpochBatches(st.Epoch)}, nil
	}
	if errors.Is(err, loader.ErrOptions) {
		return Delivery{}, fmt.Errorf("%w: session %s: %w", ErrInvalid, ss.id, err)
	}
	if err != nil {
		if ctx.Err() == nil {
			ss.metrics.errors.Inc()
		}
		return Delivery{}, fmt.Errorf("session %s: %w", ss.id, err)
	}
	// Copies: once held, the client may release the batch (even before it
	// knows of it) and the slot's descriptors be rewritten.
	d := Delivery{Epoch: b.Epoch, Iteration: b.Iteration, EpochBatches: ss.l.Sampling().EpochBatches(b.Epoch), Slot: b.Slot,
		Offsets: slices.Clone(b.Offsets), Lengths: slices.Clone(b.Lengths), Labels: slices.Clone(b.Labels),
		Indices: slices.Clone(b.Indices), Failed: slices.Clone(b.Failed)}
	for _, e := range b.Errors {
		d.Errors = append(d.Errors, e.Error())
	}
	ss.metrics.observe(b)
	ss.heldMu.Lock()
	ss.held[b.Slot] = b
	ss.heldMu.Unlock()
	return d, nil
}

// Stream hands the session's batches to out as soon as each is read, in
// order, from at (or the session's next batch), with the ends of epochs,
// until ctx ends, the session closes, or out fails: no request per batch.
// The loader's slots bound how far it runs ahead of the client: a pushed
// batch holds its slot until released (Release, from any goroutine). It
// returns nil when ctx ended. One stream per session at a time; the
// caller releases what the client no longer holds when it returns
// (ReleaseExcept).
func (m *Manager) Stream(ctx context.Context, c Caller, id string, at *Position, out func(Delivery) error) error {
	ss, err := m.lookup(c, id)
	if err != nil {
		return err
	}
	ss.streamMu.Lock()
	if ss.stopStream != nil {
		ss.streamMu.Unlock()
		return fmt.Errorf("%w: session %s is already streaming", ErrBusy, id)
	}
	ctx, cancel := context.WithCancel(ctx)
	ss.stopStream = cancel
	ss.streamMu.Unlock()
	defer func() {
		ss.streamMu.Lock()
		ss.stopStream = nil
		ss.streamMu.Unlock()
		cancel()
		ss.touch() // the idle clock starts again
	}()
	for {
		var d Delivery
		err := m.with(c, id, func(ss *session) error {
			var err error
			d, err = m.deliver(ctx, ss, at)
			return err
		})
		at = nil
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if err := out(d); err != nil {
			return err
		}
	}
}

func (ss *session) streaming() bool {
	ss.streamMu.Lock()
	defer ss.streamMu.Unlock()
	return ss.stopStream != nil
}

// Release gives back the batch in slot. It does not wait for a Next or a
// stream step of the same session.
func (m *Manager) Release(c Caller, id string, slot int) error {
	ss, err := m.lookup(c, id)
	if err != nil {
		return err
	}
	ss.touch()
	return ss.release(slot)
}

// ReleaseExcept gives back every batch the session has delivered except
// those in the slots keep: what a client still holds when its stream ends.
func (m *Manager) ReleaseExcept(c Caller, id string, keep []int) error {
	ss, err := m.lookup(c, id)
	if err != nil {
		return err
	}
	ss.heldMu.Lock()
	defer ss.heldMu.Unlock()
	for slot, b := range ss.held {
		if !slices.Contains(keep, slot) {
			delete(ss.held, slot)
			b.Release()
		}
	}
	return nil
}

// release gives back the batch the client holds in slot.
func (ss *session) release(slot int) error {
	ss.heldMu.Lock()
	defer ss.heldMu.Unlock()
	b, ok := ss.held[slot]
	if !ok {
		return fmt.Errorf("%w: slot %d holds no batch of session %s", ErrInvalid, slot, ss.id)
	}
	delete(ss.held, slot)
	b.Release()
	return nil
}

// State returns the position of the session's next batch. It does not
// wait for a Next or a stream step of the session (while streaming, the
// daemon is ahead of the client by the batches in the stream).
func (m *Manager) State(c Caller, id string) (loader.State, error) {
	ss, err := m.lookup(c, id)
	if err != nil {
		return loader.State{}, err
	}
	ss.touch()
	return ss.l.State(), nil
}

// Close ends a session (its stream first) and frees its memory.
func (m *Manager) Close(c Caller, id string) error {
	if ss, err := m.lookup(c, id); err == nil {
		ss.cancelStream()
	}
	return m.with(c, id, func(ss *session) error {
		m.closeSession(ss, "closed by client")
		return nil
	})
}

// cancelStream ends the session's stream, if one runs.
func (ss *session) cancelStream() {
	ss.streamMu.Lock()
	if ss.stopStream != nil {
		ss.stopStream()
	}
	ss.streamMu.Unlock()
}

// closeSession frees a session; ss.mu must be held.
func (m *Manager) closeSession(ss *session, why string) {
	if ss.closed {
		return
	}
	ss.closed = true
	m.mu.Lock()
	delete(m.sessions, ss.id)
	m.mu.Unlock()
	if err := ss.l.Close(); err != nil {
		m.log.Warn("session: closing", "session", ss.id, "err", err)
	}
	m.metrics.forget(ss)
	m.metrics.sessions.Dec()
	m.log.Info("session: ended", "session", ss.id, "why", why)
}

// Reap closes sessions idle longer than the timeout at now.
func (m *Manager) Reap(now time.Time) {
	m.mu.Lock()
	var idle []*session
	for _, ss := range m.sessions {
		// A streaming session's liveness is its connection: when the client
		// goes, the stream ends and the idle clock runs again.
		if !ss.streaming() && now.Sub(time.Unix(0, ss.lastUsed.Load())) > m.cfg.SessionTimeout {
			idle = append(idle, ss)
		}
	}
	m.mu.Unlock()
	for _, ss := range idle {
		if ss.mu.TryLock() { // a session busy in a request is not idle
			m.closeSession(ss, fmt.Sprintf("idle for more than %s", m.cfg.SessionTimeout))
			ss.mu.Unlock()
		}
	}
}

// CloseAll ends every session.
func (m *Manager) CloseAll() {
	for _, ss := range m.snapshot() {
		ss.cancelStream()
		ss.mu.Lock()
		m.closeSession(ss, "daemon shutting down")
		ss.mu.Unlock()
	}
}

// snapshot returns the open sessions.
func (m *Manager) snapshot() []*session {
	m.mu.Lock()
	defer m.mu.Unlock()
	all := make([]*session, 0, len(m.sessions))
	for _, ss := range m.sessions {
		all = append(all, ss)
	}
	return all
}
