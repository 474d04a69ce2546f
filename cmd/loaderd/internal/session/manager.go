// SPDX-License-Identifier: Apache-2.0

// Package session is the daemon's core, independent of any transport.
// It opens sessions over registered datasets, hands out batches and takes releases.
// It saves state, reaps idle sessions and counts it all in metrics.
// It admits what loader.NewPlan plans against the daemon's budgets and sizes nothing itself.
// Package serve adapts it to HTTP.
package session

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/fresh"
	"github.com/nvfeed/nvfeed/bmap/wds"
	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/loader"
)

// Limits on what one session may ask for (the loader's).
const (
	MaxPrefetch     = loader.MaxPrefetchQueueDepth // prefetch_queue_depth
	MaxReleaseAfter = loader.MaxReleaseAfter       // release_after
)

// Config configures a Manager. A zero limit takes its default (limits.go).
type Config struct {
	Datasets map[string]*bmap.Map // registered datasets by name
	// WebDatasets are registered webdataset maps by name; guards and checks are on their tars.
	WebDatasets map[string]*wds.Map
	// MapFiles names every dataset's map file for Reload; nil: Reload refuses.
	MapFiles        func() (map[string]string, error)
	SessionTimeout  time.Duration // idle sessions are closed after this; DefaultSessionTimeout
	MaxSessionBytes int64         // refuse sessions needing more batch memory; DefaultMaxSessionBytes
	MaxSessions     int           // open sessions, all owners together; DefaultMaxSessions
	// MaxSessionsPerUID bounds one owner's open sessions; DefaultMaxSessionsPerUID.
	MaxSessionsPerUID int
	// MaxLockedBytes bounds the page-locked batch memory of all sessions; DefaultMaxLockedBytes.
	// An open past it is refused with ErrNoSpace, as for the other budgets.
	MaxLockedBytes int64
	// MaxLockedPerUID bounds one owner's page-locked memory; 0: half of MaxLockedBytes.
	MaxLockedPerUID int64
	// MaxDeviceBytes bounds the GPU batch memory of all sessions; DefaultMaxDeviceBytes.
	MaxDeviceBytes int64
	// MaxSamplerBytes bounds the sample-order heap of all sessions (loader.SamplerBytes:
	// one batch's indices where the order is computed); DefaultMaxSamplerBytes.
	MaxSamplerBytes int64
	// MaxLockedSource, MaxDeviceSource and MaxSamplerSource say where the budgets came from.
	MaxLockedSource, MaxDeviceSource, MaxSamplerSource string
	// Memory is the environment the budgets default from; nil: ReadMemoryEnv.
	Memory *MemoryEnv
	// MaxReplaysPerUID bounds one owner's replays at once; DefaultMaxReplaysPerUID().
	MaxReplaysPerUID int
	// MaxChecksPerUID bounds one owner's whole-dataset access checks at once; DefaultMaxChecksPerUID.
	MaxChecksPerUID int
	Logger          *slog.Logger
	// Engines is EnginesPerSession (the default) or EnginesPerDevice.
	// See docs/decisions.md#raw-engines-per-session-by-default.
	Engines string
	// CUDA is the daemon's CUDA libraries; nil: found at the first GPU open.
	CUDA *cuda.Libs
	// Trust names the users whose writes a raw read may rely on, besides root.
	Trust fresh.Trust
	// Release is the daemon's release for the transport; "" reads "dev".
	Release string
	// CheckInBackground registers a dataset at once and checks its raw samples after.
	CheckInBackground bool
}

// Engine scopes (Config.Engines).
const (
	EnginesPerDevice  = "device"  // one raw engine set per device and configuration, shared by its sessions
	EnginesPerSession = "session" // every session has its own
)

// Manager owns the sessions.
type Manager struct {
	cfg     Config
	log     *slog.Logger
	access  *verdicts
	metrics *metrics
	reg     *prometheus.Registry
	shared  *loader.Shared  // engines shared by sessions; nil: per session
	devices *loader.Devices // each device's queue, split among the sessions' engines
	jobs    *jobs           // the ranks of each job (jobs.go)

	reloadMu sync.Mutex // one reload at a time

	mu       sync.Mutex
	data     map[string]*dataset       // under mu: the current registration of each dataset
	nextID   uint64                    // under mu: the next registration's serial
	sessions map[string]*session       // under mu
	opening  int                       // under mu: opens admitted under MaxSessions and not yet in sessions
	perOwner map[owner]int             // under mu: sessions open or opening, by owner
	replays  map[owner]*loader.Replays // under mu: each owner's turns to replay, while it has sessions
	locked   int64                     // under mu: page-locked batch memory reserved by sessions open or opening
	lockedBy map[owner]int64           // under mu: the same, by owner
	device   int64                     // under mu: GPU batch memory reserved by sessions open or opening
	samplers int64                     // under mu: sample-order memory reserved by sessions open or opening

	freer osFreer // returns closed sessions' sample orders to the OS

	reaped reapedLog // the sessions reaped last (reaped.go)
}

// NewManager makes a manager and registers its datasets (datasets.go).
func NewManager(cfg Config) *Manager {
	if cfg.SessionTimeout == 0 {
		cfg.SessionTimeout = DefaultSessionTimeout
	}
	if cfg.MaxSessionBytes == 0 {
		cfg.MaxSessionBytes = DefaultMaxSessionBytes
	}
	if cfg.MaxSessions == 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	if cfg.MaxSessionsPerUID == 0 {
		cfg.MaxSessionsPerUID = DefaultMaxSessionsPerUID
	}
	if cfg.MaxReplaysPerUID == 0 {
		cfg.MaxReplaysPerUID = DefaultMaxReplaysPerUID()
	}
	if cfg.MaxChecksPerUID == 0 {
		cfg.MaxChecksPerUID = DefaultMaxChecksPerUID
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CUDA == nil {
		cfg.CUDA = cuda.NewLibs(cuda.SearchFromEnv(), cfg.Logger)
	}
	cfg.memoryBudgets()
	m := &Manager{cfg: cfg, log: cfg.Logger, sessions: map[string]*session{}, perOwner: map[owner]int{}, lockedBy: map[owner]int64{}, replays: map[owner]*loader.Replays{},
		reg: prometheus.NewRegistry(), access: newVerdicts(cfg.MaxChecksPerUID, cfg.Logger), jobs: newJobs(cfg.SessionTimeout), devices: &loader.Devices{}}
	if cfg.Engines == EnginesPerDevice {
		m.shared = &loader.Shared{}
	}
	m.metrics = newMetrics(m.reg, m)
	m.data = map[string]*dataset{}
	for name, ds := range cfg.Datasets {
		m.data[name] = openDataset(name, m.nextID, ds, cfg.Trust, cfg.CheckInBackground, m.log)
		m.nextID++
	}
	for name, w := range cfg.WebDatasets {
		m.data[name] = openWebDataset(name, m.nextID, w, cfg.Trust, cfg.CheckInBackground, m.log)
		m.nextID++
	}
	return m
}

// memoryBudgets fills the budgets not given, names their sources and logs them.
// It warns when given budgets pass the memory cgroup's limit.
func (cfg *Config) memoryBudgets() {
	env := MemoryEnv{}
	if cfg.Memory != nil {
		env = *cfg.Memory
	} else {
		var err error
		if env, err = ReadMemoryEnv(); err != nil {
			cfg.Logger.Warn("session: memory budgets default without what could not be read", "err", err)
		}
	}
	given := cfg.MaxLockedBytes != 0 || cfg.MaxSamplerBytes != 0
	if cfg.MaxSamplerBytes == 0 {
		d := env.Sampler()
		cfg.MaxSamplerBytes, cfg.MaxSamplerSource = d.Bytes, d.Source
	}
	if cfg.MaxLockedBytes == 0 {
		d := env.Locked(cfg.MaxSamplerBytes)
		cfg.MaxLockedBytes, cfg.MaxLockedSource = d.Bytes, d.Source
	}
	if cfg.MaxDeviceBytes == 0 {
		cfg.MaxDeviceBytes = DefaultMaxDeviceBytes
		cfg.MaxDeviceSource = fmt.Sprintf("the default of --max-device-mb, %d MiB: GPU memory, which no memory cgroup counts", DefaultMaxDeviceBytes>>20)
	}
	cfg.MaxLockedSource = cmp.Or(cfg.MaxLockedSource, "--max-locked-mb")
	if cfg.MaxLockedPerUID == 0 {
		cfg.MaxLockedPerUID = cfg.MaxLockedBytes / 2
	}
	cfg.MaxDeviceSource = cmp.Or(cfg.MaxDeviceSource, "--max-device-mb")
	cfg.MaxSamplerSource = cmp.Or(cfg.MaxSamplerSource, "--max-sampler-mb")
	if w := env.Overcommit(cfg.MaxLockedBytes, cfg.MaxSamplerBytes); given && w != "" {
		cfg.Logger.Warn(w, "cgroup_limit_mib", env.Cgroup.Bytes>>20, "cgroup_file", env.Cgroup.File)
	}
	for _, b := range []struct {
		what   string
		n      int64
		source string
	}{{"batch memory", cfg.MaxLockedBytes, cfg.MaxLockedSource}, {"GPU batch memory", cfg.MaxDeviceBytes, cfg.MaxDeviceSource},
		{"sample order memory", cfg.MaxSamplerBytes, cfg.MaxSamplerSource}} {
		cfg.Logger.Info("session: "+b.what+" budget", "mib", b.n>>20, "source", b.source)
	}
}

// authorize returns nil if c may read every sample, else an error wrapping ErrForbidden.
func (m *Manager) authorize(ctx context.Context, d *dataset, c Caller) error {
	return m.access.authorize(ctx, d.name, d.id, d.m, d.guard, c)
}

// Stop ends every session and stops the dataset watches; the manager is
// not used after.
func (m *Manager) Stop() error {
	m.access.close()
	m.CloseAll()
	m.mu.Lock()
	var errs []error
	for name, d := range m.data {
		delete(m.data, name)
		if m.retireLocked(d) {
			errs = append(errs, d.close())
		}
	}
	m.mu.Unlock()
	return errors.Join(errs...)
}

// Registry returns the Prometheus registry holding the metrics.
func (m *Manager) Registry() *prometheus.Registry { return m.reg }

// Timeout returns the idle timeout.
func (m *Manager) Timeout() time.Duration { return m.cfg.SessionTimeout }

// MaxSessions returns the cap on open sessions, all owners together.
func (m *Manager) MaxSessions() int { return m.cfg.MaxSessions }

// Open opens a session for c, in named steps, checking the request once.
// Refusals: ErrLimit past the session limits, ErrNoSpace past a memory budget.
// ErrConflict for another fingerprint, ErrDisagree for ranks of a job that disagree.
// The access checks stop when ctx ends.
func (m *Manager) Open(ctx context.Context, c Caller, p OpenParams) (Opened, error) {
	lo, err := checkOpen(c, p)
	if err != nil {
		return Opened{}, err
	}
	d, err := m.acquire(p.Dataset) // datasets.go
	if err != nil {
		return Opened{}, err
	}
	o := &opening{m: m, c: c, p: p, d: d, lo: lo, id: newID()}
	defer o.undo()
	for _, step := range []func(context.Context) error{
		o.authorize,     // the caller may read what it names
		o.selectSamples, // the samples: files= or a webdataset's selection
		o.joinJob,       // the job's terms agree
		o.plan,          // loader.NewPlan
		o.admit,         // the budgets
		o.startSession,  // the loader opens; the session is in the table
	} {
		if err := step(ctx); err != nil {
			return Opened{}, err
		}
	}
	return o.reply(), nil
}

// opening is one Open under way: its request, what each step found, and
// what undo gives back should a step fail.
type opening struct {
	m  *Manager
	c  Caller
	p  OpenParams
	d  *dataset
	lo loader.Options // checked at the boundary (checkOpen)
	id string

	files   []int32            // files=: the samples named
	wd      *loader.WebDataset // a webdataset's selection; nil for other datasets
	job     *jobKey            // the job joined; nil: none
	planned loader.Plan
	need    res // reserved against the budgets
	ss      *session
}

// checkOpen checks the request at the daemon's boundary, once: the
// caller, the daemon's own fields (OpenParams.Validate), and the
// loader's request (loader.Request.Options).
func checkOpen(c Caller, p OpenParams) (loader.Options, error) {
	if c.UID < 0 {
		return loader.Options{}, fmt.Errorf("%w: the caller's uid is unknown", ErrForbidden)
	}
	if err := p.Validate(); err != nil { // validate.go
		return loader.Options{}, err
	}
	lo, err := p.Options()
	if err != nil {
		return loader.Options{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return lo, nil
}

// undo gives back what the steps took when no session took it over:
// the dataset and the job's shard.
func (o *opening) undo() {
	if o.ss != nil {
		return // the session releases them when it ends
	}
	if o.job != nil {
		o.m.jobs.leave(*o.job, o.p.ShardID, o.id)
	}
	o.m.release(o.d)
}

// authorize checks that the caller may open what it asks for. It must
// open the dataset's root. Each sample is opened as the caller before its
// first read (loader.Options.Access), so this costs nothing per sample.
// With files=, the named samples are checked now, and no more. A refusal
// names the path as far as the caller may list it. Refusals that tell of
// every sample come after the whole verdict.
func (o *opening) authorize(ctx context.Context) error {
	p, d, ds := o.p, o.d, o.d.m
	if len(p.Files) > 0 {
		files, unmapped, missing := resolveFiles(p.Dataset, ds, &d.files, p.Files)
		if err := authorizeFiles(ctx, d.name, ds, files, d.guard, o.c); err != nil {
			return d.unseen(err)
		}
		if err := authorizeMissing(d.name, ds, unmapped, o.c); err != nil { // files.go
			return err
		}
		if missing != nil {
			return missing
		}
		o.files = files
	} else if err := authorizeOpen(p.Dataset, ds, o.c); err != nil {
		return d.unseen(err)
	}
	conflict := p.Fingerprint != "" && p.Fingerprint != d.fingerprint
	if conflict || d.mixed != "" || p.ROI != nil || d.wds != nil {
		// These refusals name what only a reader of every sample may know:
		// the fingerprint, files and their dtypes, a sample a region does
		// not fit. A webdataset's selection tells of every tar's members.
		// So the whole verdict comes first: every sample, or tar, opened
		// as the caller, cached.
		if err := o.m.authorize(ctx, d, o.c); err != nil {
			return d.unseen(err)
		}
	}
	if conflict {
		return fmt.Errorf("%w: dataset %s has fingerprint %s, not the %s asked for: it is another dataset (remapped and reloaded, or another node's files)",
			ErrConflict, p.Dataset, d.fingerprint, p.Fingerprint)
	}
	if d.mixed != "" {
		return fmt.Errorf("%w: dataset %s is not served: %s", ErrInvalid, p.Dataset, d.mixed)
	}
	if err := d.checkContent(ctx, o.c, p.State); err != nil { // content.go
		return err
	}
	return nil
}

// selectSamples finds a webdataset's selection; files= is for other datasets.
func (o *opening) selectSamples(context.Context) error {
	wd, err := o.d.webDataset(o.p) // webdataset.go; nil for other datasets
	if err != nil {
		return err
	}
	if wd != nil && o.files != nil {
		return fmt.Errorf("%w: dataset %s is a webdataset: files= names samples of file and numpy datasets (map the tars you want instead)", ErrInvalid, o.p.Dataset)
	}
	o.wd = wd
	return nil
}

// joinJob joins the caller's job, when the request names one: its
// sessions must read alike (jobs.go).
func (o *opening) joinJob(context.Context) error {
	if o.p.JobID == "" {
		return nil
	}
	k := jobKey{o.c.owner(), o.p.JobID}
	terms := termsOf(o.p.Dataset, o.d.fingerprint, o.lo.ReaderArgs).withFiles(o.files)
	terms.selection = selectionTerm(o.p)
	if err := o.m.jobs.join(k, terms, o.p.ShardID, o.id, time.Now()); err != nil {
		return err
	}
	o.job = &k
	return nil
}

// plan gives the loader the host's parts and plans it (loader.NewPlan):
// the backend and GPU path, slots, slot size and memory footprint.
func (o *opening) plan(context.Context) error {
	m, d, lo := o.m, o.d, o.lo
	cr := credOf(o.c)
	lo.Logger, lo.SkipErrors, lo.Guard, lo.Shared, lo.Devices, lo.Cred, lo.CUDA = m.log, true, d.guard, m.shared, m.devices, (*loader.Cred)(cr), m.cfg.CUDA
	lo.Access = d.access(o.c) // access.go
	lo.Files, lo.WebDataset = o.files, o.wd
	lo.SlotSizes = &d.slotSizes // the slot size of a batch size, worked out once per dataset
	plan, err := loader.NewPlan(d.m, lo)
	if err != nil {
		return loaderError(o.p.Dataset, d.m, err)
	}
	if need := max(plan.Footprint.Host, plan.Footprint.Device); need > m.cfg.MaxSessionBytes {
		return fmt.Errorf("%w: batch_size %d with %d slots needs %d bytes of batch memory, over the daemon's limit of %d",
			ErrInvalid, o.p.BatchSize, plan.Slots, need, m.cfg.MaxSessionBytes)
	}
	o.planned = plan
	return nil
}

// admit reserves the plan's memory against the daemon's budgets.
// The sampler's memory counts the session's access and selection bitmaps too.
func (o *opening) admit(context.Context) error {
	fp, cr := o.planned.Footprint, credOf(o.c)
	need := res{locked: fp.Host, device: fp.Device, sampler: o.planned.SamplerBytes + lazyAccessBytes(o.d.m, cr) + selectionBytes(o.wd)}
	replays, err := o.m.admit(o.c.owner(), need)
	if err != nil {
		return err
	}
	o.planned.Options.Replays, o.need = replays, need
	return nil
}

// startSession opens the planned loader and puts the session in the
// table. The reservation ends here: in the session, or given back.
func (o *opening) startSession(ctx context.Context) error {
	m, p := o.m, o.p
	l, err := m.openLoader(p.Dataset, o.d.m, o.planned)
	var ss *session
	if err == nil {
		ss = newSession()
		ss.id, ss.dataset, ss.ds, ss.backend, ss.owner, ss.reserved, ss.l, ss.slots, ss.job, ss.shard = o.id, p.Dataset, o.d, l.Backend().Name(), o.c.owner(), o.need, l, o.planned.Slots, o.job, p.ShardID
		desc := l.Memory().Desc()
		ss.gpuPath, _ = l.GPUPath()
		ss.kind, ss.device, ss.opened = string(desc.Kind), desc.Device, time.Now()
		ss.backendWhy = l.BackendWhy()
		ss.content = o.d.contentFor(ctx, o.c)
		ss.metrics = m.metrics.forSession(ss, string(desc.Kind), desc.Device, desc.Size, ss.gpuPath)
		ss.touch()
	}
	m.mu.Lock()
	m.opening--
	if ss != nil {
		m.sessions[ss.id] = ss
	} else {
		m.unreserveLocked(o.c.owner(), o.need)
	}
	m.mu.Unlock()
	if err != nil {
		return err
	}
	o.ss = ss
	m.metrics.sessions.Inc()
	m.log.Info("session: opened", "session", ss.id, "dataset", p.Dataset, "backend", ss.backend, "uid", o.c.UID,
		"batch_size", p.BatchSize, "shard", p.ShardID, "num_shards", p.NumShards, "job", p.JobID, "slots", ss.slots, "memory", ss.kind)
	return nil
}

// reply is what the open answers: the session, its memory, the backend
// and GPU path, and where it starts.
func (o *opening) reply() Opened {
	ss, l, d := o.ss, o.ss.l, o.d
	st := l.State()
	st.Content = ss.content
	skipped, lacking := skippedOf(o.wd)
	return Opened{ID: ss.id, Backend: ss.backend, BackendWhy: ss.backendWhy, Memory: l.Memory().Desc(), GPUPath: ss.gpuPath,
		PrefetchQueueDepth: o.planned.PrefetchQueueDepth, ReleaseAfter: o.planned.ReleaseAfter,
		Epoch: st.Epoch, Iteration: st.Batch, EpochBatches: l.Sampling().EpochBatches(st.Epoch), State: st, Fingerprint: d.fingerprint, Content: st.Content,
		Reader: d.reader(), Components: components(o.wd), NotRaw: d.notRaw(l.Spec().ReadsExtents), Skipped: skipped, SkippedLacking: lacking}
}

// admit counts o's need against the limits or refuses it, and returns o's replay turns.
// An open counts from here until it is in the table or has failed.
func (m *Manager) admit(o owner, need res) (*loader.Replays, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n := len(m.sessions) + m.opening; n >= m.cfg.MaxSessions {
		return nil, fmt.Errorf("%w: %d sessions open, the daemon's limit", ErrLimit, n)
	}
	if n := m.perOwner[o]; n >= m.cfg.MaxSessionsPerUID {
		return nil, fmt.Errorf("%w: %s has %d sessions open, the daemon's limit per uid", ErrLimit, o, n)
	}
	if m.locked+need.locked > m.cfg.MaxLockedBytes {
		return nil, fmt.Errorf("%w: the session's batch memory (%d MiB) and the open sessions' (%d MiB) would pass the daemon's budget of %d MiB for all sessions (%s): close a session, or ask for a smaller batch_size or prefetch",
			ErrNoSpace, mib(need.locked), mib(m.locked), mib(m.cfg.MaxLockedBytes), m.cfg.MaxLockedSource)
	}
	if m.lockedBy[o]+need.locked > m.cfg.MaxLockedPerUID {
		return nil, fmt.Errorf("%w: the session's batch memory (%d MiB) and %s's open sessions' (%d MiB) would pass one uid's share of the batch memory budget, %d MiB (--max-locked-mb-per-uid; the daemon's budget for all sessions is %d MiB: %s): close one of its sessions, or ask for a smaller batch_size or prefetch",
			ErrNoSpace, mib(need.locked), o, mib(m.lockedBy[o]), mib(m.cfg.MaxLockedPerUID), mib(m.cfg.MaxLockedBytes), m.cfg.MaxLockedSource)
	}
	if m.device+need.device > m.cfg.MaxDeviceBytes {
		return nil, fmt.Errorf("%w: the session's GPU batch memory (%d MiB) and the open sessions' (%d MiB) would pass the daemon's budget of %d MiB for all sessions on every GPU (%s): close a session, or ask for a smaller batch_size or prefetch",
			ErrNoSpace, mib(need.device), mib(m.device), mib(m.cfg.MaxDeviceBytes), m.cfg.MaxDeviceSource)
	}
	if m.samplers+need.sampler > m.cfg.MaxSamplerBytes {
		return nil, fmt.Errorf("%w: the session's sample order (%d MiB: its permutation, or shuffle dali's file list and initial_fill buffer) and the open sessions' (%d MiB) would pass the daemon's budget of %d MiB for all sessions (%s): close a session, or ask for a smaller initial_fill",
			ErrNoSpace, mib(need.sampler), mib(m.samplers), mib(m.cfg.MaxSamplerBytes), m.cfg.MaxSamplerSource)
	}
	m.opening++
	m.perOwner[o]++
	m.locked += need.locked
	m.lockedBy[o] += need.locked
	m.device += need.device
	m.samplers += need.sampler
	if m.replays[o] == nil {
		m.replays[o] = loader.NewReplays(m.cfg.MaxReplaysPerUID)
	}
	return m.replays[o], nil
}

// unreserveLocked gives back what admit counted for a session of o's;
// m.mu held.
func (m *Manager) unreserveLocked(o owner, need res) {
	m.locked -= need.locked
	if m.lockedBy[o] -= need.locked; m.lockedBy[o] <= 0 {
		delete(m.lockedBy, o)
	}
	m.device -= need.device
	m.samplers -= need.sampler
	if m.perOwner[o]--; m.perOwner[o] <= 0 {
		delete(m.perOwner, o)
		// A closing session's replay may hold a turn for the moment its
		// loader takes to stop; a new session of o's gets new turns.
		delete(m.replays, o)
	}
}

// mib is n bytes in MiB, rounded up.
func mib(n int64) int64 { return (n + 1<<20 - 1) >> 20 }

// Samplers returns the sample-order memory reserved by open sessions and
// the budget for all of them (Config.MaxSamplerBytes).
func (m *Manager) Samplers() (inUse, budget int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.samplers, m.cfg.MaxSamplerBytes
}

// Locked returns the page-locked batch memory reserved by open sessions
// and the budget for all of them (Config.MaxLockedBytes).
func (m *Manager) Locked() (inUse, budget int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.locked, m.cfg.MaxLockedBytes
}

// Device returns the GPU batch memory reserved by open sessions and the
// budget for all of them (Config.MaxDeviceBytes).
func (m *Manager) Device() (inUse, budget int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.device, m.cfg.MaxDeviceBytes
}

// openLoader opens the session's loader as planned (the loader takes the
// GPU path) and maps its errors to the sentinels.
func (m *Manager) openLoader(name string, ds *bmap.Map, p loader.Plan) (*loader.Loader, error) {
	l, err := loader.Open(context.Background(), p)
	if err != nil {
		return nil, loaderError(name, ds, err)
	}
	if path, why := l.GPUPath(); path != "" {
		d := l.Memory().Desc()
		m.log.Info("session: GPU batches", "dataset", name, "gpu_path", path, "backend", l.Backend().Name(), "device", d.Device, "gpu", d.UUID, "why", why)
	}
	return l, nil
}

// loaderError maps an error of the loader's (planning or opening dataset
// name, map ds) to the sentinels.
func loaderError(name string, ds *bmap.Map, err error) error {
	switch {
	case errors.Is(err, loader.ErrNoRaw):
		return fmt.Errorf("%w: dataset %s has no samples readable from a block device (mapped on %s): use backend file", ErrInvalid, name, fsName(ds))
	case errors.Is(err, loader.ErrOptions), errors.Is(err, loader.ErrNoCUDA), errors.Is(err, loader.ErrUnsupported), errors.Is(err, loader.ErrUnavailable),
		errors.Is(err, loader.ErrUnknownGPU):
		return fmt.Errorf("%w: dataset %s: %w", ErrInvalid, name, err)
	case errors.Is(err, bmap.ErrStale), errors.Is(err, loader.ErrDevice):
		return fmt.Errorf("%w: dataset %s: %w", ErrConflict, name, err)
	}
	return fmt.Errorf("session: dataset %s: %w", name, err)
}

// fsName names the filesystem ds was mapped on, for messages.
func fsName(ds *bmap.Map) string {
	if ds.Device.FSType == "" {
		return "a filesystem without device extents"
	}
	return ds.Device.FSType
}

// Memory returns the session's batch memory description and a new file
// descriptor for it (read-only for host memory), for c to map: only the
// session's owner gets it. The caller closes the file once passed on.
func (m *Manager) Memory(c Caller, id string) (loader.MemoryDesc, *os.File, error) {
	ss, err := m.lookup(c, id)
	if err != nil {
		return loader.MemoryDesc{}, nil, err
	}
	if c.TCP {
		return loader.MemoryDesc{}, nil, fmt.Errorf("%w: session %s: batch memory is handed over only on the unix socket (as a file descriptor)", ErrForbidden, id)
	}
	ss.memMu.RLock()
	defer ss.memMu.RUnlock()
	if ss.memGone {
		return loader.MemoryDesc{}, nil, fmt.Errorf("%w: unknown session %q (closed)", ErrNotFound, id)
	}
	mem := ss.l.Memory()
	f, err := mem.Export()
	if err != nil {
		return loader.MemoryDesc{}, nil, fmt.Errorf("session %s: %w", id, err)
	}
	ss.touch()
	return mem.Desc(), f, nil
}

// lookup resolves a session and checks c owns it: the same uid on the
// unix socket, or the TCP principal over TCP.
func (m *Manager) lookup(c Caller, id string) (*session, error) {
	m.mu.Lock()
	ss := m.sessions[id]
	m.mu.Unlock()
	if ss == nil {
		if err := m.reaped.error(c, id, m.cfg.SessionTimeout); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: unknown session %q (closed, reaped after %s idle, or never opened)", ErrNotFound, id, m.cfg.SessionTimeout)
	}
	if c.owner() != ss.owner {
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

// Check returns nil if the session exists and belongs to c.
func (m *Manager) Check(c Caller, id string) error {
	_, err := m.lookup(c, id)
	return err
}

// Close ends a session and frees its memory. A Next or stream of the
// session waiting for its batch (behind a dali replay, say) ends first,
// at once: the Next with an error wrapping ErrNotFound that says so.
func (m *Manager) Close(c Caller, id string) error {
	if ss, err := m.lookup(c, id); err == nil {
		ss.interrupt("closed by client")
	}
	return m.with(c, id, func(ss *session) error {
		m.closeSession(ss, "closed by client")
		return nil
	})
}

// closeSession frees a session; ss.mu must be held.
func (m *Manager) closeSession(ss *session, why string) {
	if ss.closed {
		return
	}
	ss.closed = true
	ss.interrupt(why)
	m.mu.Lock()
	delete(m.sessions, ss.id)
	m.unreserveLocked(ss.owner, ss.reserved)
	m.mu.Unlock()
	ss.memMu.Lock()
	ss.memGone = true
	err := ss.l.Close()
	ss.memMu.Unlock()
	if err != nil {
		m.log.Warn("session: closing", "session", ss.id, "err", err)
	}
	if ss.reserved.sampler >= freeOSAfter {
		m.freer.soon()
	}
	m.release(ss.ds) // after its loader, which reads through the dataset's guard
	if ss.job != nil {
		m.jobs.leave(*ss.job, ss.shard, ss.id)
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
			m.reaped.add(ss.id, ss.owner, now)
			ss.mu.Unlock()
		}
	}
}

// CloseAll ends every session: the waits of all first (a pending Next
// returns at once, ErrNotFound saying why), then each in turn.
func (m *Manager) CloseAll() {
	all := m.snapshot()
	for _, ss := range all {
		ss.interrupt("daemon shutting down")
	}
	for _, ss := range all {
		ss.mu.Lock()
		m.closeSession(ss, "daemon shutting down")
		ss.mu.Unlock()
	}
}

// snapshot returns the open sessions.
func (m *Manager) snapshot() []*session {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Collect(maps.Values(m.sessions))
}
