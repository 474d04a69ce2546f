// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ebitengine/purego"
	"golang.org/x/sys/unix"
)

// The walk: a library root loads must be changeable by no one but root or the process's user.
// walk resolves a path itself with lstat, following each symlink hop by hop, and judges every entry:
//
//   - it is owned by uid 0 or the process's euid;
//   - its directory is writable by no one else, or sticky;
//   - a name missing from a directory others may write is refused;
//   - the file is a regular file writable by no one else.
//
// openChecked opens the resolved path O_NOFOLLOW, checks the descriptor again with fstat,
// and loads it through /proc/self/fd/N: what is loaded is the inode judged.

// maxHops bounds the symlinks one walk follows (the kernel's own bound).
const maxHops = 40

// errRefused marks a walk's refusal: someone other than root or the
// process's user could change what would be loaded.
var errRefused = errors.New("refused")

// errAbsent marks a name that is not there (or not a library file),
// under directories no one else may write: nothing to load, nothing
// anyone could put there.
var errAbsent = errors.New("absent")

// checkedFile is a library file the walk judged: its path with every
// symlink resolved, and its identity.
type checkedFile struct {
	real     string
	dev, ino uint64
}

// refuse returns a refusal of the walk saying why.
func refuse(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errRefused, fmt.Sprintf(format, args...))
}

// othersMayWrite says who besides root may write a file of st ("" none):
// others, or a group other than gid 0.
func othersMayWrite(st *unix.Stat_t) string {
	switch {
	case st.Mode&0o002 != 0:
		return fmt.Sprintf("writable by others (mode %04o)", st.Mode&0o7777)
	case st.Mode&0o020 != 0 && st.Gid != 0:
		return fmt.Sprintf("writable by group %d (mode %04o)", st.Gid, st.Mode&0o7777)
	}
	return ""
}

// trustedOwner says why st's owner is not trusted ("" trusted): uid 0
// and euid are.
func trustedOwner(p string, st *unix.Stat_t, euid uint32) error {
	if st.Uid != 0 && st.Uid != euid {
		return refuse("%s is owned by uid %d, who could replace the library (root loads it)", p, st.Uid)
	}
	return nil
}

// judge checks one entry p (st) held by directory dir (dst).
func judge(p string, st *unix.Stat_t, dir string, dst *unix.Stat_t, euid uint32) error {
	if err := trustedOwner(p, st, euid); err != nil {
		return err
	}
	if w := othersMayWrite(dst); w != "" && dst.Mode&unix.S_ISVTX == 0 {
		return refuse("%s is in %s, which is %s and not sticky: they could replace it (root loads the library)", p, dir, w)
	}
	return nil
}

// splitPath returns the components of p, "." and empty ones left out.
func splitPath(p string) []string {
	var out []string
	for _, c := range strings.Split(p, "/") {
		if c != "" && c != "." {
			out = append(out, c)
		}
	}
	return out
}

// walk resolves path as described above and returns the file it reaches,
// or errRefused (wrapped, saying which entry and why), or errAbsent
// (wrapped) when there is no library file there.
func walk(path string, euid uint32) (checkedFile, error) {
	if !filepath.IsAbs(path) {
		abs, err := filepath.Abs(path)
		if err != nil {
			return checkedFile{}, fmt.Errorf("%w: %s: %v", errAbsent, path, err)
		}
		path = abs
	}
	var rootSt unix.Stat_t
	if err := unix.Lstat("/", &rootSt); err != nil {
		return checkedFile{}, fmt.Errorf("cuda: walking %s: /: %w", path, err)
	}
	if err := trustedOwner("/", &rootSt, euid); err != nil {
		return checkedFile{}, err
	}
	cur, curSt := "/", rootSt // resolved so far: no symlink in it, every entry judged
	rest := splitPath(path)
	hops := 0
	for len(rest) > 0 {
		name := rest[0]
		rest = rest[1:]
		if name == ".." {
			cur = filepath.Dir(cur)
			if err := unix.Lstat(cur, &curSt); err != nil {
				return checkedFile{}, fmt.Errorf("%w: %s: %v", errAbsent, cur, err)
			}
			continue
		}
		next := filepath.Join(cur, name)
		var st unix.Stat_t
		if err := unix.Lstat(next, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				if w := othersMayWrite(&curSt); w != "" {
					return checkedFile{}, refuse("%s is missing from %s, which is %s: anyone could make it (root would load what they put there)", next, cur, w)
				}
			}
			return checkedFile{}, fmt.Errorf("%w: %s: %v", errAbsent, next, err)
		}
		if err := judge(next, &st, cur, &curSt, euid); err != nil {
			return checkedFile{}, err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			if hops++; hops > maxHops {
				return checkedFile{}, refuse("%s: more than %d symlinks on the way", path, maxHops)
			}
			target, err := os.Readlink(next)
			if err != nil {
				return checkedFile{}, fmt.Errorf("%w: %s: %v", errAbsent, next, err)
			}
			if filepath.IsAbs(target) {
				cur, curSt = "/", rootSt
			}
			rest = append(splitPath(target), rest...)
		case unix.S_IFDIR:
			cur, curSt = next, st
		case unix.S_IFREG:
			if len(rest) > 0 {
				return checkedFile{}, fmt.Errorf("%w: %s: %v", errAbsent, next, unix.ENOTDIR)
			}
			if w := othersMayWrite(&st); w != "" {
				return checkedFile{}, refuse("%s is %s, who could change the library (root loads it)", next, w)
			}
			return checkedFile{real: next, dev: st.Dev, ino: st.Ino}, nil
		default:
			return checkedFile{}, fmt.Errorf("%w: %s is not a regular file (mode %o)", errAbsent, next, st.Mode)
		}
	}
	return checkedFile{}, fmt.Errorf("%w: %s is a directory", errAbsent, cur)
}

// maxDeps bounds the chain of $ORIGIN dependencies openChecked loads
// before a library.
const maxDeps = 8

// openChecked loads library file c, which walk judged, by its descriptor.
// The descriptor must still be the judged inode, trusted and unwritable by others.
// It stays open for the process's life, so no other file takes its number.
// DT_NEEDED libraries found through $ORIGIN are walked and loaded the same way first.
func openChecked(c checkedFile, euid uint32, depth int) (uintptr, error) {
	fd, err := unix.Open(c.real, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return 0, fmt.Errorf("cuda: opening %s: %w", c.real, err)
	}
	keep := false
	defer func() {
		if !keep {
			unix.Close(fd)
		}
	}()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("cuda: fstat of %s: %w", c.real, err)
	}
	switch {
	case st.Dev != c.dev || st.Ino != c.ino:
		return 0, refuse("%s changed after it was checked (inode %d:%d, now %d:%d)", c.real, c.dev, c.ino, st.Dev, st.Ino)
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return 0, refuse("%s is no longer a regular file", c.real)
	case othersMayWrite(&st) != "":
		return 0, refuse("%s is %s", c.real, othersMayWrite(&st))
	}
	if err := trustedOwner(c.real, &st, euid); err != nil {
		return 0, err
	}
	if err := loadOriginDeps(fd, c.real, euid, depth); err != nil {
		return 0, err
	}
	h, err := purego.Dlopen(fmt.Sprintf("/proc/self/fd/%d", fd), purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return 0, fmt.Errorf("cuda: %s: %w", c.real, err)
	}
	keep = true
	return h, nil
}

// loadOriginDeps loads, through walk and openChecked, the DT_NEEDED
// libraries of the ELF file open at fd (at real) that its $ORIGIN search
// path finds.
func loadOriginDeps(fd int, real string, euid uint32, depth int) error {
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cuda: reading %s: %w", real, err)
	}
	file := os.NewFile(uintptr(d), real)
	defer file.Close()
	f, err := elf.NewFile(file)
	if err != nil {
		return nil // not ELF: the loader says why
	}
	var dirs []string
	for _, tag := range []elf.DynTag{elf.DT_RPATH, elf.DT_RUNPATH} {
		paths, _ := f.DynString(tag)
		for _, p := range paths {
			for _, d := range strings.Split(p, ":") {
				for _, o := range []string{"$ORIGIN", "${ORIGIN}"} {
					if rest, ok := strings.CutPrefix(d, o); ok {
						dirs = append(dirs, filepath.Join(filepath.Dir(real), rest))
					}
				}
			}
		}
	}
	if len(dirs) == 0 {
		return nil
	}
	needed, _ := f.DynString(elf.DT_NEEDED)
	for _, n := range needed {
		for _, d := range dirs {
			p := filepath.Join(d, n)
			if _, err := os.Lstat(p); err != nil {
				continue
			}
			if depth >= maxDeps {
				return refuse("%s: more than %d levels of $ORIGIN dependencies", real, maxDeps)
			}
			c, err := walk(p, euid)
			if err != nil {
				return fmt.Errorf("cuda: %s needs %s: %w", real, p, err)
			}
			if _, err := openChecked(c, euid, depth+1); err != nil {
				return fmt.Errorf("cuda: %s needs %s: %w", real, p, err)
			}
			break
		}
	}
	return nil
}
