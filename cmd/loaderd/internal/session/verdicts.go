// SPDX-License-Identifier: Apache-2.0

package session

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/fresh"
	"github.com/nvfeed/nvfeed/internal/cred"
)

// Whole-dataset access verdicts (docs/security.md): may a caller read every sample?
// Listings and refusals that tell of every sample ask it.
// The kernel judges it as the caller: seconds of CPU at a million samples.
// So a verdict is kept per dataset and credentials and judged again only where it changed.
// Callers with the same credentials share one check; it stops when the last goes.
// One owner runs at most Config.MaxChecksPerUID checks at once.

// Check scopes (the scope label of nvfeed_access_checks_total).
const (
	scopeFull      = "full"      // every sample opened as the caller
	scopeChanges   = "changes"   // only the samples changed since the last verdict
	scopeKept      = "kept"      // a refusal whose sample did not change: nothing opened
	scopeCancelled = "cancelled" // stopped: every caller waiting for it went away
)

// checkFunc opens as c the root and the samples idx lists, until ctx is done.
// It returns the sample refused (-1: none or the root) and the refusal.
type checkFunc func(ctx context.Context, ds *bmap.Map, idx []int32, c *cred.Cred, g *fresh.Guard, opened func(n int)) (int, error)

// verdicts caches access verdicts per dataset and credentials, and runs the checks.
type verdicts struct {
	mu       sync.Mutex
	cache    map[verdictKey]verdict         // under mu
	checking map[verdictKey]*pendingVerdict // under mu: checks running now
	started  uint64                         // under mu: checks started so far

	check  checkFunc // checkSamples; tests replace it
	turns  *turns    // each owner's checks running at once
	log    *slog.Logger
	ctx    context.Context // cancelled by close: every check stops
	cancel context.CancelFunc

	opened *prometheus.CounterVec // samples opened by checks, by dataset
	checks *prometheus.CounterVec // checks ended, by dataset and scope
}

// newVerdicts returns an empty cache running at most perOwner checks per owner at once.
func newVerdicts(perOwner int, log *slog.Logger) *verdicts {
	ctx, cancel := context.WithCancel(context.Background())
	return &verdicts{cache: map[verdictKey]verdict{}, checking: map[verdictKey]*pendingVerdict{}, check: checkSamples,
		turns: newTurns(perOwner), log: log, ctx: ctx, cancel: cancel,
		opened: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nvfeed_access_opened_samples_total",
			Help: "Samples opened as a caller to judge whether it may read a whole dataset (a listing, /metrics, a refusal naming what only readers know)."}, []string{"dataset"}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "nvfeed_access_checks_total",
			Help: "Whole-dataset access checks ended, by scope: full (every sample), changes (the samples changed since the last), kept (a refusal still standing, nothing opened), cancelled (every caller waiting went away)."},
			[]string{"dataset", "scope"}),
	}
}

// close stops every check; callers waiting get an error.
func (v *verdicts) close() { v.cancel() }

// pendingVerdict is an access check in progress, shared by callers with the same key.
// It is cancelled when the last caller waiting for it goes away.
type pendingVerdict struct {
	done    chan struct{}
	gen     uint64 // the dataset's watch generation when it began
	seq     uint64 // verdicts.started when it began
	cancel  context.CancelFunc
	begun   atomic.Bool // it has its turn: what it judges is from then on
	waiters int         // under verdicts.mu
	v       verdict     // set before done is closed
	err     error       // set before done is closed: why there is no verdict (cancelled)
}

// verdictKey is a verdict's key: a dataset's registration and the credentials judged.
// A reload never inherits verdicts; a process that dropped a group never shares one.
type verdictKey struct {
	dataset  uint64 // the registration's serial
	uid, gid int
	groups   string
}

func keyOf(dataset uint64, c Caller) verdictKey {
	gs := slices.Clone(c.Groups)
	slices.Sort(gs)
	var b strings.Builder
	for _, g := range gs {
		b.WriteString(strconv.FormatUint(uint64(g), 10))
		b.WriteByte(',')
	}
	return verdictKey{dataset, c.UID, c.GID, b.String()}
}

// verdict is a check's result, valid while the watch generation is gen.
// It also needs every directory above the root as anc recorded it; nil anc is never reused.
// Once either moved, the next check opens only the samples changed since since.
type verdict struct {
	err     error
	refused int // the sample err names (-1: none, or none in particular: the root)
	gen     uint64
	since   fresh.Since
	anc     []*fresh.Ancestors // the root's, then each linked path's (fresh.Guard.Linked)
}

// holds reports whether v still holds at gen: nothing changed under or above the root.
func (v verdict) holds(gen uint64) bool {
	return v.gen == gen && v.above()
}

// above reports whether nothing above the root or a symlink's target changed since v.
func (v verdict) above() bool {
	if len(v.anc) == 0 {
		return false
	}
	for _, a := range v.anc {
		if a == nil || a.Check() != nil {
			return false
		}
	}
	return true
}

// snapshot takes the ancestors' snapshots a verdict on ds depends on; nil where one fails.
func snapshot(ds *bmap.Map, g *fresh.Guard) []*fresh.Ancestors {
	paths := append([]string{ds.Root}, g.Linked()...)
	out := make([]*fresh.Ancestors, len(paths))
	for k, p := range paths {
		a, err := fresh.SnapshotAncestors(p)
		if err != nil {
			return nil
		}
		out[k] = a
	}
	return out
}

// authorize returns nil if c may read every sample of the dataset, else an ErrForbidden.
// The error names the dataset and the first path refused.
// Verdicts are kept until a watch sees a change; then only the changed samples are opened.
// Without a watch every call checks every sample.
func (v *verdicts) authorize(ctx context.Context, name string, id uint64, ds *bmap.Map, g *fresh.Guard, c Caller) error {
	vd, err := v.get(ctx, name, id, ds, g, c)
	if err != nil {
		return err
	}
	if vd.err != nil {
		return refusal(name, c, vd.err)
	}
	return nil
}

// get returns the kept verdict while it holds, else one judged after this call began.
// Callers with the same credentials share one check; it stops when none waits any more.
func (v *verdicts) get(ctx context.Context, name string, id uint64, ds *bmap.Map, g *fresh.Guard, c Caller) (verdict, error) {
	key := keyOf(id, c)
	v.mu.Lock()
	arrived := v.started
	v.mu.Unlock()
	for {
		v.mu.Lock()
		gen := generation(g)
		old, kept := v.cache[key]
		if g != nil && kept && old.holds(gen) {
			v.mu.Unlock()
			return old, nil
		}
		p := v.checking[key]
		// One that began before this call serves only if nothing changed since.
		earlier := p != nil && p.seq <= arrived && p.begun.Load()
		if p == nil || (earlier && (g == nil || p.gen != gen)) {
			p, earlier = v.start(name, key, gen, old, kept, ds, g, c), false
		}
		p.waiters++
		v.mu.Unlock()
		select {
		case <-p.done:
		case <-ctx.Done():
			v.leave(key, p)
			return verdict{}, fmt.Errorf("session: access check of dataset %s as %s: %w", name, c.owner(), ctx.Err())
		}
		switch {
		case p.err != nil && (ctx.Err() != nil || v.ctx.Err() != nil):
			return verdict{}, fmt.Errorf("session: access check of dataset %s as %s: %w", name, c.owner(), p.err)
		case p.err != nil: // cancelled by callers who left as this one joined: check again
			continue
		case earlier && !p.v.holds(gen): // a change above the root came during it
			continue
		}
		return p.v, nil
	}
}

// start starts a check for key at generation gen, judging only what changed since old.
func (v *verdicts) start(name string, key verdictKey, gen uint64, old verdict, kept bool, ds *bmap.Map, g *fresh.Guard, c Caller) *pendingVerdict {
	v.started++
	ctx, cancel := context.WithCancel(v.ctx)
	p := &pendingVerdict{done: make(chan struct{}), gen: gen, seq: v.started, cancel: cancel}
	v.checking[key] = p
	go func() {
		defer cancel()
		vd, err := v.judge(ctx, name, c, &p.begun, gen, old, kept, ds, g)
		v.mu.Lock()
		if v.checking[key] == p {
			delete(v.checking, key)
		}
		// A check of an older generation never replaces a newer verdict.
		if cur, ok := v.cache[key]; err == nil && g != nil && (!ok || cur.gen <= gen) {
			v.cache[key] = vd
		}
		p.v, p.err = vd, err
		v.mu.Unlock()
		close(p.done)
	}()
	return p
}

// leave ends a caller's wait for p; the last to leave cancels it.
func (v *verdicts) leave(key verdictKey, p *pendingVerdict) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if p.waiters--; p.waiters == 0 {
		p.cancel()
		if v.checking[key] == p {
			delete(v.checking, key)
		}
	}
}

// judge checks c's access to ds in its owner's turn; begun is set once it has one.
// It opens the samples changed since old where the guard can tell, else every sample.
func (v *verdicts) judge(ctx context.Context, name string, c Caller, begun *atomic.Bool, gen uint64, old verdict, kept bool, ds *bmap.Map, g *fresh.Guard) (verdict, error) {
	release, err := v.turns.take(ctx, c.owner())
	if err != nil {
		v.checks.WithLabelValues(name, scopeCancelled).Inc()
		return verdict{}, err
	}
	defer release()
	begun.Store(true)
	t0 := time.Now()
	vd := verdict{gen: gen, refused: -1}
	if g != nil {
		// The snapshots and the guard's point come before the opens.
		// A change after them is seen at the next call.
		vd.anc, vd.since = snapshot(ds, g), g.Now()
	}
	idx, scope := todo(old, kept, g)
	if scope == scopeKept {
		vd.err, vd.refused = old.err, old.refused
		v.checks.WithLabelValues(name, scope).Inc()
		return vd, nil
	}
	opened := v.opened.WithLabelValues(name)
	var n atomic.Int64 // the check's threads add to it
	vd.refused, vd.err = v.check(ctx, ds, idx, credOf(c), g, func(k int) { opened.Add(float64(k)); n.Add(int64(k)) })
	if err := ctx.Err(); err != nil {
		v.checks.WithLabelValues(name, scopeCancelled).Inc()
		v.log.Info("session: access check stopped: no caller waits for it", "dataset", name, "uid", c.UID, "opened", n.Load(), "seconds", time.Since(t0).Seconds())
		return verdict{}, err
	}
	v.checks.WithLabelValues(name, scope).Inc()
	lvl := slog.LevelDebug
	if scope == scopeFull {
		lvl = slog.LevelInfo
	}
	v.log.Log(ctx, lvl, "session: access checked as the caller", "dataset", name, "uid", c.UID, "scope", scope, "opened", n.Load(),
		"readable", vd.err == nil, "seconds", time.Since(t0).Seconds())
	return vd, nil
}

// todo returns the samples a check must open again after old, and the check's scope.
// Only the changed samples where the guard can tell; every sample (nil, scopeFull) where not.
func todo(old verdict, kept bool, g *fresh.Guard) ([]int32, string) {
	if !kept || g == nil || !old.above() {
		return nil, scopeFull
	}
	idx := []int32{}
	if !g.ChangedSince(old.since, func(i int) { idx = append(idx, int32(i)) }) {
		return nil, scopeFull
	}
	if old.err == nil {
		return idx, scopeChanges
	}
	if _, changed := slices.BinarySearch(idx, int32(old.refused)); old.refused < 0 || changed {
		return nil, scopeFull // the refused sample may be readable now: the others were never all judged
	}
	return nil, scopeKept
}

// forget drops the verdicts of registration id (replaced by a reload).
func (v *verdicts) forget(id uint64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for k := range v.cache {
		if k.dataset == id {
			delete(v.cache, k)
		}
	}
}

// turns bounds how many checks one owner runs at once.
type turns struct {
	n  int
	mu sync.Mutex
	of map[owner]*ownerTurns // under mu: owners with a check running or waiting
}

// ownerTurns is one owner's turns and how many checks hold or wait for one.
type ownerTurns struct {
	ch    chan struct{}
	users int // under turns.mu
}

func newTurns(n int) *turns { return &turns{n: max(n, 1), of: map[owner]*ownerTurns{}} }

// take waits for a turn of o's or for ctx to end; release gives it back.
func (t *turns) take(ctx context.Context, o owner) (release func(), err error) {
	t.mu.Lock()
	ot := t.of[o]
	if ot == nil {
		ot = &ownerTurns{ch: make(chan struct{}, t.n)}
		t.of[o] = ot
	}
	ot.users++
	t.mu.Unlock()
	done := func() {
		t.mu.Lock()
		if ot.users--; ot.users == 0 {
			delete(t.of, o)
		}
		t.mu.Unlock()
	}
	select {
	case ot.ch <- struct{}{}:
		return func() { <-ot.ch; done() }, nil
	case <-ctx.Done():
		done()
		return nil, ctx.Err()
	}
}
