// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Ancestors is a snapshot of every directory a path to a dataset root passes through.
// Symlinks on the way are followed and their targets' directories taken too.
// No watch of the dataset sees a chmod, ACL, rename or mount above the root.
//
// Each entry keeps device, inode, mode, owner, group, change time and access ACL.
// Where only the change time moved, the ACL is compared again: one getxattr, not a new check.
// A snapshot is a handful of statx calls, cheap enough to compare at every verdict's use.
type Ancestors struct {
	root  string
	nodes []ancestor
}

// ancestor is one directory or symlink on the way to the root.
type ancestor struct {
	path       string // as visited, for the error
	dev        uint64
	ino        uint64
	mode       uint32
	uid, gid   uint32
	ctimeSec   int64
	ctimeNsec  uint32
	linkTarget string // a symlink's target; "" for a directory
	acl        string // system.posix_acl_access as the kernel gives it; "" for none
}

// same reports whether b, taken now, grants what the snapshot a did. The
// entry, mode, owner and group must be the same. The change time must be
// the same too, or, where only it moved, the ACL read again now.
func (a ancestor) same(b ancestor) bool {
	acl := a.acl
	a.acl, b.acl = "", ""
	if a == b {
		return true
	}
	a.ctimeSec, a.ctimeNsec, b.ctimeSec, b.ctimeNsec = 0, 0, 0, 0
	if a != b {
		return false
	}
	now, err := readACL(b.path)
	return err == nil && now == acl
}

// readACL returns p's access ACL (not following a final symlink), "" for
// none.
func readACL(p string) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(p, "system.posix_acl_access", buf)
		switch {
		case errors.Is(err, unix.ENODATA) || errors.Is(err, unix.EOPNOTSUPP):
			return "", nil
		case errors.Is(err, unix.ERANGE) && len(buf) < 1<<16:
			buf = make([]byte, 2*len(buf))
			continue
		case err != nil:
			return "", fmt.Errorf("fresh: ACL of %s: %w", p, err)
		}
		return string(buf[:n]), nil
	}
}

// maxLinks bounds the symlinks followed on the way to a root (the
// kernel's own limit is 40).
const maxLinks = 40

// ErrAncestorsChanged is what Ancestors.Check wraps when a directory or
// symlink on the way to the root is no longer as it was.
var ErrAncestorsChanged = errors.New("fresh: a directory above the dataset root changed")

// SnapshotAncestors walks root (an absolute path) component by component
// as the kernel resolves it and records every directory and symlink on
// the way, root included.
func SnapshotAncestors(root string) (*Ancestors, error) {
	a := &Ancestors{root: root}
	err := a.walk(func(n ancestor) error {
		var err error
		if n.acl, err = readACL(n.path); err != nil {
			return err
		}
		a.nodes = append(a.nodes, n)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}

// Check walks the path again and reports nil if every entry is as it
// was, else an error wrapping ErrAncestorsChanged naming the first that
// is not.
func (a *Ancestors) Check() error {
	k := 0
	err := a.walk(func(n ancestor) error {
		if k >= len(a.nodes) || !a.nodes[k].same(n) {
			return fmt.Errorf("%w: %s (dataset root %s)", ErrAncestorsChanged, n.path, a.root)
		}
		k++
		return nil
	})
	if err == nil && k != len(a.nodes) {
		err = fmt.Errorf("%w: the path to %s resolves through fewer entries", ErrAncestorsChanged, a.root)
	}
	if err != nil && !errors.Is(err, ErrAncestorsChanged) {
		err = fmt.Errorf("%w: %w", ErrAncestorsChanged, err)
	}
	return err
}

// Len returns how many entries the snapshot holds.
func (a *Ancestors) Len() int { return len(a.nodes) }

// walk resolves a.root from "/" one component at a time, calling visit
// with each entry: "/" first, then each component; a symlink is visited
// itself and then its target's components are walked in its place.
func (a *Ancestors) walk(visit func(ancestor) error) error {
	if !filepath.IsAbs(a.root) {
		return fmt.Errorf("fresh: dataset root %q is not absolute", a.root)
	}
	n, err := statEntry("/")
	if err != nil {
		return err
	}
	if err := visit(n); err != nil {
		return err
	}
	cur := "/"
	todo := splitPath(a.root)
	links := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		p := filepath.Join(cur, c)
		n, err := statEntry(p)
		if err != nil {
			return err
		}
		if err := visit(n); err != nil {
			return err
		}
		if n.linkTarget == "" {
			cur = p
			continue
		}
		if links++; links > maxLinks {
			return fmt.Errorf("fresh: %s: %w", a.root, unix.ELOOP)
		}
		if filepath.IsAbs(n.linkTarget) {
			cur = "/"
		}
		todo = append(splitPath(n.linkTarget), todo...)
	}
	return nil
}

// splitPath returns p's components, without empty ones.
func splitPath(p string) []string {
	var out []string
	for _, c := range strings.Split(p, "/") {
		if c != "" {
			out = append(out, c)
		}
	}
	return out
}

// statEntry takes one entry's statx without following a final symlink;
// a symlink's target is read too.
func statEntry(p string) (ancestor, error) {
	var st unix.Statx_t
	mask := unix.STATX_TYPE | unix.STATX_MODE | unix.STATX_UID | unix.STATX_GID | unix.STATX_INO | unix.STATX_CTIME
	if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_SYNC_AS_STAT, mask, &st); err != nil {
		return ancestor{}, fmt.Errorf("fresh: statx %s: %w", p, err)
	}
	n := ancestor{path: p, dev: unix.Mkdev(st.Dev_major, st.Dev_minor), ino: st.Ino, mode: uint32(st.Mode),
		uid: st.Uid, gid: st.Gid, ctimeSec: st.Ctime.Sec, ctimeNsec: st.Ctime.Nsec}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		buf := make([]byte, unix.PathMax)
		k, err := unix.Readlink(p, buf)
		if err != nil {
			return ancestor{}, fmt.Errorf("fresh: readlink %s: %w", p, err)
		}
		if n.linkTarget = string(buf[:k]); n.linkTarget == "" {
			return ancestor{}, fmt.Errorf("fresh: %s: an empty symlink: %w", p, unix.ENOENT)
		}
	}
	return n, nil
}
