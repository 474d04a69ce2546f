package session

import (
	"fmt"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/fresh"
)

// The access model: the daemon may run as root (raw reads need the block
// device), so it serves a caller a dataset only if the caller could read
// every sample of it through the filesystem itself: search permission on
// every directory from / down to each class directory, read permission on
// every file. Permission is judged from owner, group and mode bits, as the
// kernel does (the owner class if the uid owns it, else the group class if
// one of its groups owns it, else other). A file or directory with a POSIX
// ACL is granted through its owner class only, so an ACL entry can never
// make the daemon more permissive than the filesystem. Root may read
// everything. A caller whose uid is unknown (loopback TCP) is judged as a
// user in no group (the other class).

// identity is who is judged: uid (-1 unknown) and every group it is in.
type identity struct {
	uid  int
	gids []uint32
}

// identify resolves a caller's groups: its primary group from the
// connection (SO_PEERCRED) and its supplementary groups from the user
// database.
func identify(c Caller) identity {
	id := identity{uid: c.UID}
	if c.UID < 0 {
		return id
	}
	if c.GID >= 0 {
		id.gids = append(id.gids, uint32(c.GID))
	}
	if u, err := user.LookupId(strconv.Itoa(c.UID)); err == nil {
		if gs, err := u.GroupIds(); err == nil {
			for _, g := range gs {
				if n, err := strconv.ParseUint(g, 10, 32); err == nil && !slices.Contains(id.gids, uint32(n)) {
					id.gids = append(id.gids, uint32(n))
				}
			}
		}
	}
	return id
}

const aclXattr = "system.posix_acl_access"

// allowed reports whether id has perm (unix.R_OK, unix.X_OK: the "other"
// bit) on the file described by st at path.
func (id identity) allowed(path string, st *unix.Stat_t, perm uint32) bool {
	if id.uid == 0 {
		return true
	}
	mode := st.Mode
	switch {
	case id.uid >= 0 && st.Uid == uint32(id.uid):
		return mode&(perm<<6) != 0
	case slices.Contains(id.gids, st.Gid):
		if mode&(perm<<3) == 0 {
			return false
		}
	default:
		if mode&perm == 0 {
			return false
		}
	}
	// Granted through the group or other class: an ACL could narrow that
	// for this uid (a named-user entry), so one present refuses.
	n, err := unix.Getxattr(path, aclXattr, nil)
	return n <= 0 && err != nil
}

// checkAccess returns nil if id may read every sample of ds through the
// filesystem, else an error naming the first path refused. Ancestors of
// the root are checked apart (they are outside the dataset's watch).
func checkAccess(ds *bmap.Map, id identity) error {
	if id.uid == 0 {
		return nil
	}
	var st unix.Stat_t
	dir := func(p string) error {
		if err := unix.Stat(p, &st); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if !id.allowed(p, &st, unix.X_OK) {
			return fmt.Errorf("%s: no search permission on the directory", p)
		}
		return nil
	}
	if err := dir(ds.Root); err != nil {
		return err
	}
	for _, c := range ds.Classes {
		if err := dir(filepath.Join(ds.Root, c)); err != nil {
			return err
		}
	}
	n := len(ds.Samples)
	var next atomic.Int64
	var mu sync.Mutex
	first, firstIdx := error(nil), n
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var st unix.Stat_t
			for {
				lo := int(next.Add(512)) - 512
				if lo >= n {
					return
				}
				for i := lo; i < min(lo+512, n); i++ {
					p := filepath.Join(ds.Root, ds.Samples[i].Path)
					var err error
					if e := unix.Stat(p, &st); e != nil {
						err = fmt.Errorf("%s: %w", p, e)
					} else if !id.allowed(p, &st, unix.R_OK) {
						err = fmt.Errorf("%s: no read permission", p)
					}
					if err != nil {
						mu.Lock()
						if i < firstIdx {
							first, firstIdx = err, i
						}
						mu.Unlock()
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// checkAncestors checks search permission on every directory above the
// dataset root.
func checkAncestors(root string, id identity) error {
	if id.uid == 0 {
		return nil
	}
	var st unix.Stat_t
	for d := filepath.Dir(root); ; d = filepath.Dir(d) {
		if err := unix.Stat(d, &st); err != nil {
			return fmt.Errorf("%s: %w", d, err)
		}
		if !id.allowed(d, &st, unix.X_OK) {
			return fmt.Errorf("%s: no search permission on the directory", d)
		}
		if d == "/" {
			return nil
		}
	}
}

// verdicts caches access verdicts per (dataset, uid, gid) while the
// dataset's watch generation is unchanged.
type verdicts struct {
	mu       sync.Mutex
	cache    map[verdictKey]verdict          // under mu
	checking map[verdictKey]*pendingVerdict  // under mu: checks running now
	check    func(*bmap.Map, identity) error // checkAccess; tests replace it
}

func newVerdicts() *verdicts {
	return &verdicts{cache: map[verdictKey]verdict{}, checking: map[verdictKey]*pendingVerdict{}, check: checkAccess}
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

// authorize returns nil if c may read every sample of dataset name (ds,
// watched by g, nil for none) through the filesystem, else an error
// wrapping ErrForbidden that names the dataset and the first path refused.
// Verdicts are cached until the watch sees a change; without a watch
// every call checks.
func (v *verdicts) authorize(name string, ds *bmap.Map, g *fresh.Guard, c Caller) error {
	id := identify(c)
	err := checkAncestors(ds.Root, id)
	if err == nil {
		err = v.get(name, ds, g, c, id).err
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

// get returns the cached verdict for (dataset, uid, gid) while the
// dataset's watch generation is unchanged, else checks access. The check
// (a stat of every file: seconds at ImageNet scale) runs outside the lock:
// concurrent opens by the same caller share one check, and other callers
// and datasets are not held up by it.
func (v *verdicts) get(name string, ds *bmap.Map, g *fresh.Guard, c Caller, id identity) verdict {
	key := verdictKey{name, c.UID, c.GID}
	v.mu.Lock()
	var gen uint64
	if g != nil {
		g.Poll()
		gen = g.Generation()
		if old, ok := v.cache[key]; ok && old.gen == gen {
			v.mu.Unlock()
			return old
		}
		if p := v.checking[key]; p != nil && p.v.gen == gen {
			v.mu.Unlock()
			<-p.done
			return p.v
		}
	}
	p := &pendingVerdict{done: make(chan struct{}), v: verdict{gen: gen}}
	if g != nil {
		v.checking[key] = p
	}
	v.mu.Unlock()

	p.v.err = v.check(ds, id)
	v.mu.Lock()
	if g != nil {
		if v.checking[key] == p {
			delete(v.checking, key)
		}
		// A check of an older generation never replaces a newer verdict.
		if old, ok := v.cache[key]; !ok || old.gen <= gen {
			v.cache[key] = p.v
		}
	}
	v.mu.Unlock()
	close(p.done)
	return p.v
}
