// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"bytes"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// mountTable tells when a mount or unmount beneath some folders changes
// what their paths lead to. No inotify event tells of one: a mount over a
// class folder hides the files the caller could reach there.
//
// The kernel flags the process's mount table for POLLPRI inside a mount
// call. Only then is the table read, and only mount points beneath the
// folders count: a training node mounts and unmounts elsewhere (a
// container starting) without making any verdict unusable. Where a mount
// is kept beneath them, before or after, a flagged look is a change: the
// kernel reuses a freed mount ID, so a mount replaced by another at the
// same point can read the same in the table. An unmount is not always
// flagged (the kernel skips the flag when no other mount came between),
// so each mount point kept is stat'ed at every look and compared with
// what the stat said at the last read. There are none on a plain dataset.
type mountTable struct {
	fd     int          // /proc/self/mountinfo; not os.Open's: the runtime's epoll would take the flag
	under  []string     // absolute paths, symlinks resolved: a mount at or beneath one counts
	points []mountPoint // the mounts at or beneath them, as last read
	seen   []mountStat  // what a stat of each point's path said at the last read
	failed bool         // the last read failed: the next look reads again, a change
}

// mountPoint is one mount at or beneath a watched folder.
type mountPoint struct {
	id uint64
	at string
}

// mountStat is what a stat of a mount point's path said: the mount it
// leads to (its unique ID where the kernel gives one), or the error.
type mountStat struct {
	id  uint64
	err error
}

// statMount stats path p, not following a last symlink nor syncing a
// network filesystem.
func statMount(p string) mountStat {
	var st unix.Statx_t
	flags := unix.AT_SYMLINK_NOFOLLOW | unix.AT_NO_AUTOMOUNT | unix.AT_STATX_DONT_SYNC
	if err := unix.Statx(unix.AT_FDCWD, p, flags, unix.STATX_MNT_ID|unix.STATX_MNT_ID_UNIQUE, &st); err != nil {
		return mountStat{err: err}
	}
	if st.Mask&(unix.STATX_MNT_ID|unix.STATX_MNT_ID_UNIQUE) == 0 {
		return mountStat{err: unix.ENOTSUP}
	}
	return mountStat{id: st.Mnt_id}
}

// mountInfo is the process's mount table.
const mountInfo = "/proc/self/mountinfo"

// openMountTable starts watching the mount points at or beneath the folder root.
func openMountTable(root string) (*mountTable, error) {
	r, err := filepath.EvalSymlinks(root)
	if err != nil {
		return nil, fmt.Errorf("fresh: watching mounts beneath %s: %w", root, err)
	}
	fd, err := unix.Open(mountInfo, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("fresh: watching the mount table: %s: %w", mountInfo, err)
	}
	t := &mountTable{fd: fd, under: []string{r}}
	if err := t.read(); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return t, nil
}

// add watches the mount points at or beneath paths too, where they lead
// now; one leading nowhere is left out.
func (t *mountTable) add(paths []string) {
	for _, p := range paths {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			t.under = append(t.under, r)
		}
	}
	t.read() // a failure is a change at the next look (failed)
}

// changed reports whether a mount at or beneath the folders may have
// come or gone since the last call: a kept point's stat differs, or the
// table was flagged with a mount kept before or after (a flagged look
// with none beneath either time is no change). A failure to poll or
// read counts as a change.
func (t *mountTable) changed() bool {
	fds := []unix.PollFd{{Fd: int32(t.fd), Events: unix.POLLPRI}}
	n, err := unix.Poll(fds, 0)
	flagged := err != nil || (n > 0 && fds[0].Revents&(unix.POLLPRI|unix.POLLERR) != 0)
	stale := t.failed
	for k, p := range t.points {
		if stale {
			break
		}
		stale = statMount(p.at) != t.seen[k]
	}
	if !flagged && !stale {
		return false
	}
	kept := len(t.points) > 0
	err = t.read()
	return stale || err != nil || kept || len(t.points) > 0
}

// read reads the table and keeps the mounts that count, and what a stat
// of each says. The table is read again after the stats: a mount or
// unmount between would otherwise leave a stat that matches no kept
// table. A failure is kept in failed.
func (t *mountTable) read() error {
	err := t.settle()
	t.failed = err != nil
	return err
}

// settle is read's work: the table, read until it holds still around the stats.
func (t *mountTable) settle() error {
	table := func() ([]mountPoint, error) {
		b, err := preadAll(t.fd)
		if err != nil {
			return nil, fmt.Errorf("fresh: reading %s: %w", mountInfo, err)
		}
		return mountsBeneath(b, t.under)
	}
	now, err := table()
	for range 3 {
		if err != nil {
			return err
		}
		seen := make([]mountStat, len(now))
		for k, p := range now {
			seen[k] = statMount(p.at)
		}
		again, err2 := table()
		if err2 == nil && slices.Equal(again, now) {
			t.points, t.seen = now, seen
			return nil
		}
		now, err = again, err2
	}
	return fmt.Errorf("fresh: %s: the mounts beneath %v changed at every read", mountInfo, t.under)
}

// close stops watching.
func (t *mountTable) close() error { return unix.Close(t.fd) }

// preadAll reads all of fd from offset 0.
func preadAll(fd int) ([]byte, error) {
	var out []byte
	buf := make([]byte, 64<<10)
	for off := int64(0); ; {
		n, err := unix.Pread(fd, buf, off)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return nil, err
		case n == 0:
			return out, nil
		}
		out = append(out, buf[:n]...)
		off += int64(n)
	}
}

// mountsBeneath returns the mounts in table (as /proc/self/mountinfo
// gives it) at or beneath one of dirs, in its order. A line it cannot
// parse is an error naming it.
func mountsBeneath(table []byte, dirs []string) ([]mountPoint, error) {
	var out []mountPoint
	for n, line := range bytes.Split(table, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		f := strings.Fields(string(line))
		if len(f) < 5 {
			return nil, fmt.Errorf("fresh: %s line %d: %d fields, want at least 5", mountInfo, n+1, len(f))
		}
		id, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("fresh: %s line %d: mount ID %q: %w", mountInfo, n+1, f[0], err)
		}
		at, err := unescapeMount(f[4])
		if err != nil {
			return nil, fmt.Errorf("fresh: %s line %d: mount point: %w", mountInfo, n+1, err)
		}
		if slices.ContainsFunc(dirs, func(d string) bool { return beneath(at, d) }) {
			out = append(out, mountPoint{id: id, at: at})
		}
	}
	return out, nil
}

// beneath reports whether path p is d or lies beneath it.
func beneath(p, d string) bool {
	d = strings.TrimSuffix(d, "/")
	return p == d || strings.HasPrefix(p, d+"/")
}

// unescapeMount undoes the kernel's octal escapes (\040 for a space) in a
// mountinfo path.
func unescapeMount(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if i+4 > len(s) {
			return "", fmt.Errorf("%q: a backslash not followed by three octal digits", s)
		}
		v, err := strconv.ParseUint(s[i+1:i+4], 8, 8)
		if err != nil {
			return "", fmt.Errorf("%q: a backslash not followed by three octal digits", s)
		}
		b.WriteByte(byte(v))
		i += 3
	}
	return b.String(), nil
}
