// SPDX-License-Identifier: Apache-2.0

// Package testfs gives tests real filesystems. It makes an image file and
// formats it as ext4, xfs or btrfs, or it mounts a tmpfs. It attaches
// images with `losetup --direct-io=on` and mounts them. It undoes all of it
// when the test ends, even when the test fails.
//
// A test that uses it skips with a printed reason when not run as root,
// when no loop device can be had, or when the mkfs tool is missing. It
// never passes silently.
package testfs

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/testenv"
)

// Options describes the filesystem to make.
type Options struct {
	Type     string   // "ext4", "xfs", "btrfs" or "tmpfs"
	SizeMB   int      // image size (sparse); default 512
	MkfsArgs []string // extra mkfs arguments, e.g. {"-O", "inline_data"}
}

// FS is a mounted test filesystem.
type FS struct {
	Type  string // filesystem type
	Dir   string // mount point
	Dev   string // loop device ("" for tmpfs)
	Image string // backing image file ("" for tmpfs)
}

// Ext4 returns options for ext4 with inline_data and 4 KiB blocks.
func Ext4() Options {
	return Options{Type: "ext4", MkfsArgs: []string{"-b", "4096", "-O", "inline_data"}}
}

// XFS returns options for xfs with default settings.
func XFS() Options { return Options{Type: "xfs"} }

// New makes, attaches and mounts a filesystem and registers its teardown
// with t.Cleanup. It skips the test (with the reason) when it cannot run.
func New(t testing.TB, o Options) *FS {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "testfs: needs root to attach loop devices and mount (euid %d)", os.Geteuid())
	}
	if o.SizeMB == 0 {
		o.SizeMB = 512
	}
	dir := t.TempDir()
	fs := &FS{Type: o.Type, Dir: filepath.Join(dir, "mnt")}
	if err := os.Mkdir(fs.Dir, 0o755); err != nil {
		t.Fatalf("testfs: %v", err)
	}
	if o.Type == "tmpfs" {
		if out, err := run("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%dm", o.SizeMB), "tmpfs", fs.Dir); err != nil {
			testenv.SkipPrivileged(t, "testfs: cannot mount tmpfs: %v: %s", err, out)
		}
		t.Cleanup(func() { fs.unmount(t) })
		return fs
	}
	mkfs := "mkfs." + o.Type
	if _, err := exec.LookPath(mkfs); err != nil {
		testenv.SkipPrivileged(t, "testfs: %s not installed (make test installs it through apt when run as root)", mkfs)
	}
	fs.Image = filepath.Join(dir, o.Type+".img")
	f, err := os.Create(fs.Image)
	if err != nil {
		t.Fatalf("testfs: %v", err)
	}
	if err := f.Truncate(int64(o.SizeMB) << 20); err != nil {
		f.Close()
		t.Fatalf("testfs: %v", err)
	}
	f.Close()
	force := map[string]string{"ext4": "-F", "xfs": "-f", "btrfs": "-f"}[o.Type]
	args := append([]string{"-q", force}, o.MkfsArgs...)
	args = append(args, fs.Image)
	if out, err := run(mkfs, args...); err != nil {
		t.Fatalf("testfs: %s %s: %v: %s", mkfs, strings.Join(args, " "), err, out)
	}
	out, err := run("losetup", "--find", "--show", "--direct-io=on", fs.Image)
	if err != nil {
		testenv.SkipPrivileged(t, "testfs: no loop device: losetup: %v: %s", err, out)
	}
	fs.Dev = strings.TrimSpace(out)
	if out, err := run("mount", fs.Dev, fs.Dir); err != nil {
		run("losetup", "-d", fs.Dev)
		t.Fatalf("testfs: mount %s %s: %v: %s", fs.Dev, fs.Dir, err, out)
	}
	t.Cleanup(func() {
		fs.unmount(t)
		if out, err := run("losetup", "-d", fs.Dev); err != nil {
			t.Errorf("testfs: losetup -d %s: %v: %s", fs.Dev, err, out)
		}
	})
	return fs
}

func (fs *FS) unmount(t testing.TB) {
	var out string
	var err error
	for i := 0; i < 20; i++ {
		if out, err = run("umount", fs.Dir); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	run("umount", "-l", fs.Dir)
	t.Errorf("testfs: umount %s: %v: %s", fs.Dir, err, out)
}

// Path joins elements onto the mount point.
func (fs *FS) Path(elem ...string) string {
	return filepath.Join(append([]string{fs.Dir}, elem...)...)
}

// WriteFile writes data to the relative path rel, creating parent
// directories, and fails the test on error.
func (fs *FS) WriteFile(t testing.TB, rel string, data []byte) {
	t.Helper()
	p := fs.Path(rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Sync flushes the filesystem so that the device holds every written byte.
func (fs *FS) Sync(t testing.TB) {
	t.Helper()
	if out, err := run("sync", "-f", fs.Dir); err != nil {
		t.Fatalf("testfs: sync: %v: %s", err, out)
	}
}

// DropCaches writes back and drops the page cache, dentries and inodes, so
// that the next reads come from the device.
func DropCaches() error {
	if out, err := run("sync"); err != nil {
		return fmt.Errorf("sync: %v: %s", err, out)
	}
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
}

// Command runs a command and returns its combined output, for tests that
// compare with system tools such as filefrag.
func Command(name string, args ...string) (string, error) { return run(name, args...) }

func run(name string, args ...string) (string, error) {
	var b bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	return b.String(), err
}

// MapDir returns a block map of the dataset at root without extents, from
// discovery and stat alone: enough for the file backend, on any
// filesystem. Every sample is marked filesystem-only.
func MapDir(t testing.TB, root string) *bmap.Map {
	t.Helper()
	classes, entries, err := bmap.Discover(root, bmap.DiscoverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := &bmap.Map{Version: bmap.Version, Root: root, Classes: classes}
	for _, e := range entries {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(root, e.Path), &st); err != nil {
			t.Fatal(err)
		}
		m.Samples = append(m.Samples, bmap.Sample{Path: e.Path, Label: e.Label, Size: st.Size, Inode: st.Ino,
			MtimeNs: st.Mtim.Nano(), CtimeNs: st.Ctim.Nano(), Reason: bmap.UnknownPlace})
	}
	return m
}
