// SPDX-License-Identifier: Apache-2.0

package session

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/fresh"
	"github.com/nvfeed/nvfeed/internal/cred"
	"github.com/nvfeed/nvfeed/loader"
)

// The access model (docs/security.md): the daemon runs as root.
// It serves a dataset only if the kernel lets the caller open every sample.
// It opens each sample on threads switched to the caller's uid, gid and groups.
// So the kernel judges modes, ACLs, directories and symlinks as for the caller.
// A TCP caller of unknown uid is judged as nobody.
// The loader then reads with the same credentials (loader.Options.Cred).

// nobody is who a caller of unknown uid is judged as.
const nobody = 65534

// credOf returns the credentials c is judged as, or nil for root.
func credOf(c Caller) *cred.Cred {
	if c.UID == 0 {
		return nil
	}
	if c.UID < 0 {
		return &cred.Cred{UID: nobody, GID: nobody}
	}
	return &cred.Cred{UID: uint32(c.UID), GID: uint32(c.GID), Groups: slices.Clone(c.Groups)}
}

// refused reports whether an open's error is a refusal, not a missing file.
func refused(err error) bool {
	return errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM)
}

// checkWorkers is how many threads one check uses: a quarter of the CPUs, in [2, 8].
func checkWorkers() int { return min(8, max(2, runtime.GOMAXPROCS(0)/4)) }

// checkChunk is how many samples a thread opens between looks at its context.
const checkChunk = 256

// checkAccess returns nil if c may open the root and every sample, else the first refusal.
// A path leading to no file or another file is marked changed in g, not refused.
func checkAccess(ds *bmap.Map, c *cred.Cred, g *fresh.Guard) error {
	_, err := checkSamples(context.Background(), ds, nil, c, g, nil)
	return err
}

// checkSamples is checkAccess over the samples idx lists (nil: all), on checkWorkers threads.
// It returns the first refusal and its sample, -1 for none or the root.
// opened, when not nil, is told how many samples each stretch of opens took.
func checkSamples(ctx context.Context, ds *bmap.Map, idx []int32, c *cred.Cred, g *fresh.Guard, opened func(n int)) (int, error) {
	if c == nil {
		return -1, nil
	}
	if err := c.Do(func() error {
		fd, err := unix.Open(ds.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", ds.Root, err)
		}
		return unix.Close(fd)
	}); err != nil {
		return -1, err
	}
	n := len(ds.Samples)
	if idx != nil {
		n = len(idx)
	}
	at := func(k int) int {
		if idx != nil {
			return int(idx[k])
		}
		return k
	}
	var next atomic.Int64
	var mu sync.Mutex
	first, firstK := error(nil), n
	fail := func(k int, err error) {
		mu.Lock()
		if k < firstK {
			first, firstK = err, k
		}
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for range min(checkWorkers(), (n+checkChunk-1)/checkChunk) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
			if err := c.Become(); err != nil {
				fail(-1, err)
				return
			}
			for {
				lo := int(next.Add(checkChunk)) - checkChunk
				if lo >= n {
					return
				}
				if err := ctx.Err(); err != nil {
					fail(-1, fmt.Errorf("access check as uid %d stopped: %w", c.UID, err))
					return
				}
				hi := min(lo+checkChunk, n)
				for k := lo; k < hi; k++ {
					if err := openSample(ds, at(k), g); err != nil {
						fail(k, err)
						hi = k + 1
						break
					}
				}
				if opened != nil {
					opened(hi - lo)
				}
			}
		}()
	}
	wg.Wait()
	if first == nil || firstK < 0 {
		return -1, first
	}
	return at(firstK), first
}

// openSample opens sample i as the calling thread's credentials and returns the refusal, if any.
// A path leading to no file or another file is marked changed in g, not refused.
func openSample(ds *bmap.Map, i int, g *fresh.Guard) error {
	p := filepath.Join(ds.Root, ds.Samples[i].Path)
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err == nil {
		var st unix.Stat_t
		if g != nil && (unix.Fstat(fd, &st) != nil || (ds.Samples[i].Inode != 0 && st.Ino != ds.Samples[i].Inode)) {
			g.MarkChanged(i)
		}
		unix.Close(fd)
		return nil
	}
	if g != nil {
		g.MarkChanged(i)
	}
	if refused(err) {
		return fmt.Errorf("%s: %w", listable(ds.Root, ds.Samples[i].Path), err)
	}
	return nil
}

// openRoot returns nil if c may reach and search the dataset's root, else the refusal.
// The kernel judges the walk and faccessat2(X_OK, AT_EACCESS) as for c.
func openRoot(ds *bmap.Map, c *cred.Cred) error {
	if c == nil {
		return nil
	}
	return c.Do(func() error {
		fd, err := unix.Open(ds.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", ds.Root, err)
		}
		defer unix.Close(fd)
		if err := unix.Faccessat2(fd, "", unix.X_OK, unix.AT_EACCESS|unix.AT_EMPTY_PATH); err != nil {
			return fmt.Errorf("%s: %w", ds.Root, err)
		}
		return nil
	})
}

// lazyAccess is the access verdicts, sample by sample, of one dataset
// registration and one set of credentials: the sessions with them share it
// (lazyShares), so a node's ranks open each sample once, not once each.
// Each sample is opened as the caller before its first read, and again after any change.
// anc snapshots the directories above the root and above where its symlinks lead.
type lazyAccess struct {
	name string
	ds   *bmap.Map
	g    *fresh.Guard // nil: no watch, every batch checks all its samples
	c    *cred.Cred

	mu      sync.Mutex
	gen     uint64             // under mu
	anc     []*fresh.Ancestors // under mu; nil: none taken (never holds)
	ancAt   time.Time          // under mu: when anc was last found unchanged
	ok      []uint64           // under mu: a bit per sample the caller opened
	cleared uint64             // under mu: how many times ok was cleared
	ancStat time.Duration      // how long anc's re-stat is trusted: ancestorsEvery

	open func(ds *bmap.Map, i int, g *fresh.Guard) error // openSample; tests replace it
}

// ancestorsEvery is how often a session re-stats the directories above its root.
const ancestorsEvery = 100 * time.Millisecond

// newLazyAccess returns c's sample-by-sample access check on dataset name.
func newLazyAccess(name string, ds *bmap.Map, g *fresh.Guard, c *cred.Cred) *lazyAccess {
	return &lazyAccess{name: name, ds: ds, g: g, c: c, ok: make([]uint64, (len(ds.Samples)+63)/64), ancStat: ancestorsEvery, open: openSample}
}

// lazyShares holds a registration's lazyAccess per owner and credentials while a session uses it.
// A session's reference keeps it; the last one gone, the collector frees it.
type lazyShares struct {
	mu sync.Mutex
	m  map[lazyKey]weak.Pointer[lazyAccess]
}

// lazyKey is a shared lazyAccess's key: the credentials judged, and whether
// the owner is the TCP principal, so that no owner learns from a check's
// speed what another read.
type lazyKey struct {
	verdictKey
	tcp bool
}

// access returns caller c's check on d for loader.Options.Access, shared with
// every session of d with the same owner and credentials; nil for root.
// A session's first batch re-stats the directories above the root whatever
// the last session's re-stat, so a new session sees a revocation at once.
func (d *dataset) access(c Caller) func([]int) []loader.Refused {
	a := d.lazy(c)
	if a == nil {
		return nil
	}
	var began atomic.Bool
	return func(samples []int) []loader.Refused { return a.admit(samples, !began.Swap(true)) }
}

// lazy returns the lazyAccess of d's sessions with c's owner and credentials; nil for root.
func (d *dataset) lazy(c Caller) *lazyAccess {
	cr := credOf(c)
	if cr == nil {
		return nil
	}
	s, k := &d.shares, lazyKey{keyOf(d.id, c), c.TCP}
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.m[k].Value(); a != nil {
		return a
	}
	a := newLazyAccess(d.name, d.m, d.guard, cr)
	if s.m == nil {
		s.m = map[lazyKey]weak.Pointer[lazyAccess]{}
	}
	s.m[k] = weak.Make(a)
	runtime.AddCleanup(a, func(k lazyKey) {
		s.mu.Lock()
		if s.m[k].Value() == nil { // not one made since
			delete(s.m, k)
		}
		s.mu.Unlock()
	}, k)
	return a
}

// lazyAccessBytes is what a session's lazyAccess holds: a bit a sample;
// nothing for root. Each session counts it, shared or not.
func lazyAccessBytes(ds *bmap.Map, c *cred.Cred) int64 {
	if c == nil {
		return 0
	}
	return 8 * int64((len(ds.Samples)+63)/64)
}

// admit returns the samples c may not open, each wrapping ErrForbidden and the kernel's refusal.
// Samples opened since the generation last moved are not opened again.
// restat re-stats the directories above the root now, however recent the last time.
// The opens run outside mu, so sessions sharing a verdict do not wait on each other's;
// what they found is kept only if nothing cleared the verdicts meanwhile.
func (a *lazyAccess) admit(samples []int, restat bool) []loader.Refused {
	a.mu.Lock()
	gen, now := generation(a.g), time.Now()
	if restat || a.gen != gen || now.Sub(a.ancAt) >= a.ancStat {
		if (verdict{gen: a.gen, anc: a.anc}).holds(gen) {
			a.ancAt = now
		} else {
			a.ancAt = time.Time{}
		}
	}
	if a.ancAt.IsZero() {
		// Something changed or nothing is known: open every sample again.
		// The snapshot comes first, so a later change is seen at the next batch.
		clear(a.ok)
		a.cleared++
		a.gen, a.anc = gen, nil
		if a.g != nil {
			a.anc = snapshot(a.ds, a.g)
			if a.anc != nil {
				a.ancAt = now
			}
		}
	}
	var todo []int
	for k, i := range samples {
		if a.ok[i/64]&(1<<(i%64)) == 0 {
			todo = append(todo, k)
		}
	}
	cleared := a.cleared
	a.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	var out []loader.Refused
	opened := make([]int, 0, len(todo))
	err := a.c.Do(func() error {
		for _, k := range todo {
			i := samples[k]
			if err := a.open(a.ds, i, a.g); err != nil {
				shown := strings.TrimPrefix(listable(a.ds.Root, a.ds.Samples[i].Path), a.ds.Root+string(filepath.Separator))
				out = append(out, loader.Refused{At: k, Path: shown,
					Err: fmt.Errorf("%w: dataset %s: uid %d (gid %d, groups %v) may not read it: %w", ErrForbidden, a.name, a.c.UID, a.c.GID, a.c.Groups, err)})
				continue
			}
			opened = append(opened, i)
		}
		return nil
	})
	if err != nil { // the thread could not take the caller's credentials: read nothing
		out = out[:0]
		for k, i := range samples {
			out = append(out, loader.Refused{At: k, Path: a.ds.Samples[i].Path, Err: fmt.Errorf("session: checking access as %v: %w", a.c, err)})
		}
		return out
	}
	a.mu.Lock()
	if a.cleared == cleared {
		for _, i := range opened {
			a.ok[i/64] |= 1 << (i % 64)
		}
	}
	a.mu.Unlock()
	return out
}

// generation is g's watch generation after taking in what its watches saw; 0 for no guard.
func generation(g *fresh.Guard) uint64 {
	if g == nil {
		return 0
	}
	g.Poll()
	return g.Generation()
}

// listable returns sample rel's path as far as the thread's credentials may list it.
// A component is named only if its parent can be listed; the rest is "…".
func listable(root, rel string) string {
	shown := root
	parts := strings.Split(filepath.Clean(rel), string(filepath.Separator))
	for _, part := range parts {
		fd, err := unix.Open(shown, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return filepath.Join(shown, "…")
		}
		unix.Close(fd)
		shown = filepath.Join(shown, part)
	}
	return shown
}

// authorizeOpen returns nil if c may open dataset name's root, else an ErrForbidden.
// Samples are checked as they are first read.
func authorizeOpen(name string, ds *bmap.Map, c Caller) error {
	if err := openRoot(ds, credOf(c)); err != nil {
		return refusal(name, c, err)
	}
	return nil
}

// authorizeFiles returns nil if c may read the samples idx lists, else authorize's error.
// It is not cached: it opens only those files, once per open.
func authorizeFiles(ctx context.Context, name string, ds *bmap.Map, idx []int32, g *fresh.Guard, c Caller) error {
	if _, err := checkSamples(ctx, ds, idx, credOf(c), g, nil); err != nil {
		return refusal(name, c, err)
	}
	return nil
}

// refusal is the error refusing c dataset name, naming the path err names.
func refusal(name string, c Caller, err error) error {
	who := "a caller of unknown uid, judged as nobody,"
	if c.UID >= 0 {
		who = fmt.Sprintf("uid %d (gid %d, groups %v)", c.UID, c.GID, c.Groups)
		if c.TCP {
			who = "the TCP principal, " + who + ","
		}
	}
	return fmt.Errorf("%w: dataset %s: %s may not read it through the filesystem: %w", ErrForbidden, name, who, err)
}
