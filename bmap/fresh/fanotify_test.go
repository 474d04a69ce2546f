// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"bytes"
	"context"
	"encoding/binary"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

// linkedGuard maps an ext4 with classes a and b (3 samples each), a
// folder "outside" beside the dataset root, and an unrelated file there;
// it opens a Watch guard and checks it has the filesystem-wide watch.
func linkedGuard(t *testing.T) (*testfs.FS, *bmap.Map, *Guard) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "fresh: the filesystem-wide watch needs CAP_SYS_ADMIN (euid %d)", os.Geteuid())
	}
	fs := testfs.New(t, testfs.Ext4())
	for _, p := range []string{"a/0.jpg", "a/1.jpg", "a/2.jpg", "b/0.jpg", "b/1.jpg", "b/2.jpg"} {
		fs.WriteFile(t, "train/"+p, bytes.Repeat([]byte(p), 3000))
	}
	fs.WriteFile(t, "outside/unrelated.dat", bytes.Repeat([]byte("U"), 9000))
	fs.Sync(t)
	m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := Open(m, Watch, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	if g.Method() != Watch || g.fan == nil {
		t.Fatalf("method %s, filesystem-wide watch %v: want both watches", g.Method(), g.fan != nil)
	}
	return fs, m, g
}

// TestFanotifySeesChangesThroughOtherLinks: a sample changed through a
// hard link outside the dataset's directories (which the inotify watch
// does not see) needs a stat, is no longer PathUnchanged, and moves the
// generation; the other samples stay unchanged; an unrelated file's
// change marks nothing and leaves the generation where it was.
func TestFanotifySeesChangesThroughOtherLinks(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(t *testing.T, link string)
	}{
		{"chmod", func(t *testing.T, link string) { must(t, os.Chmod(link, 0o600)) }},
		{"setfacl", func(t *testing.T, link string) { run(t, "setfacl", "-m", "u:65534:---", link) }},
		{"write", func(t *testing.T, link string) {
			f, err := os.OpenFile(link, os.O_WRONLY, 0)
			must(t, err)
			_, err = f.WriteAt([]byte("NEW"), 10)
			f.Close()
			must(t, err)
		}},
		{"truncate", func(t *testing.T, link string) { must(t, os.Truncate(link, 0)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, m, g := linkedGuard(t)
			victim := 4 // b/1.jpg
			if m.Samples[victim].Path != "b/1.jpg" {
				t.Fatalf("sample %d is %s", victim, m.Samples[victim].Path)
			}
			link := fs.Path("outside", "y")
			must(t, os.Link(fs.Path("train", "b/1.jpg"), link))
			g.Poll()
			// The new link itself changed the inode (its link count): marked.
			if !g.NeedStat(victim) || g.PathUnchanged(victim) {
				t.Errorf("after ln: NeedStat %v PathUnchanged %v, want true false", g.NeedStat(victim), g.PathUnchanged(victim))
			}
			g0 := g.Generation()
			if g.Generation() != g0 {
				t.Fatalf("the generation moves with nothing changed")
			}
			tc.do(t, link)
			g.Poll()
			if g.Generation() == g0 {
				t.Errorf("%s through %s: the generation did not move", tc.name, link)
			}
			for i := range m.Samples {
				if i != victim && (g.NeedStat(i) || !g.PathUnchanged(i)) {
					t.Errorf("sample %s, untouched, marked changed", m.Samples[i].Path)
				}
			}
			// An unrelated file's change marks nothing.
			g1 := g.Generation()
			must(t, os.Chmod(fs.Path("outside", "unrelated.dat"), 0o600))
			must(t, os.WriteFile(fs.Path("outside", "unrelated.dat"), []byte("changed"), 0o600))
			g.Poll()
			if g.Generation() != g1 {
				t.Errorf("an unrelated file's change moved the generation")
			}
		})
	}
}

// TestFanotifyReindexesReplacedSamples: a sample replaced by a rename
// (seen by inotify) is recorded again at the next Generation, so a later
// change to the new file through an outside link is seen too.
func TestFanotifyReindexesReplacedSamples(t *testing.T) {
	fs, _, g := linkedGuard(t)
	tmp := fs.Path("train", "a", ".new")
	must(t, os.WriteFile(tmp, []byte("replacement"), 0o644))
	must(t, os.Rename(tmp, fs.Path("train", "a", "1.jpg")))
	g.Poll()
	g.Generation() // reindexes
	g0 := g.Generation()
	must(t, os.Link(fs.Path("train", "a", "1.jpg"), fs.Path("outside", "z")))
	must(t, os.Chmod(fs.Path("outside", "z"), 0o600))
	g.Poll()
	if g.Generation() == g0 {
		t.Errorf("a chmod of the replacement through an outside link did not move the generation")
	}
}

// TestFanotifyOverflow: a queue overflow event marks every sample
// changed and makes the generation move at every call from then on.
func TestFanotifyOverflow(t *testing.T) {
	var logs bytes.Buffer
	f := &fanWatch{changed: newBitset(3), hashOf: make([]uint64, 3), log: slog.New(slog.NewTextHandler(&logs, nil))}
	f.first, f.dups = map[uint64]int32{}, map[uint64][]int32{}
	ev := make([]byte, 24)
	binary.NativeEndian.PutUint32(ev[0:], 24)
	ev[4] = 3
	binary.NativeEndian.PutUint16(ev[6:], 24)
	binary.NativeEndian.PutUint64(ev[8:], unix.FAN_Q_OVERFLOW)
	f.mu.Lock()
	f.events(ev)
	f.mu.Unlock()
	for i := range 3 {
		if !f.Changed(i) {
			t.Errorf("sample %d not changed after an overflow", i)
		}
	}
	if a, b := f.Generation(), f.Generation(); a == b {
		t.Errorf("after an overflow the generation stays at %d", a)
	}
	if !strings.Contains(logs.String(), "overflowed") {
		t.Errorf("no log of the overflow: %q", logs.String())
	}
}

// TestFallbackWithoutCapSysAdmin: where fanotify is refused (the guard
// opened on a thread without CAP_SYS_ADMIN: a real EPERM), the guard
// falls back to Read — every raw sample stat'ed after its read, nothing
// PathUnchanged, the generation moving at every call — and logs why.
func TestFallbackWithoutCapSysAdmin(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "fresh: dropping CAP_SYS_ADMIN needs it first (euid %d)", os.Geteuid())
	}
	fs := testfs.New(t, testfs.Ext4())
	fs.WriteFile(t, "train/a/0.jpg", bytes.Repeat([]byte("x"), 9000))
	fs.Sync(t)
	m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	g, err := openWithoutSysAdmin(m, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if gen := g.Generation(); g.Method() != Read || !g.NeedStat(0) || g.PathUnchanged(0) || g.Generation() == gen {
		t.Errorf("method %s NeedStat %v PathUnchanged %v: want the Read behaviour", g.Method(), g.NeedStat(0), g.PathUnchanged(0))
	}
	if !strings.Contains(logs.String(), "fanotify") || !strings.Contains(logs.String(), "operation not permitted") {
		t.Errorf("the log does not say why: %q", logs.String())
	}
}

// openWithoutSysAdmin opens a Watch guard on a locked thread whose
// effective capabilities lack CAP_SYS_ADMIN (the thread ends with it).
func openWithoutSysAdmin(m *bmap.Map, log *slog.Logger) (*Guard, error) {
	type res struct {
		g   *Guard
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			ch <- res{nil, err}
			return
		}
		data[unix.CAP_SYS_ADMIN/32].Effective &^= 1 << (unix.CAP_SYS_ADMIN % 32)
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			ch <- res{nil, err}
			return
		}
		g, err := Open(m, Watch, log)
		ch <- res{g, err}
	}()
	r := <-ch
	return r.g, r.err
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}

// TestMoveExtReport: does EXT4_IOC_MOVE_EXT (a sample's blocks swapped
// with a donor file's, through the sample's own fd) reach the
// filesystem-wide watch? It logs the answer; the raw reads' trust check
// closes that path whatever it is.
func TestMoveExtReport(t *testing.T) {
	fs, m, g := linkedGuard(t)
	victim := 0
	orig, err := os.OpenFile(fs.Path("train", m.Samples[victim].Path), os.O_RDWR, 0)
	must(t, err)
	defer orig.Close()
	donor, err := os.OpenFile(fs.Path("outside", "donor"), os.O_RDWR|os.O_CREATE, 0o600)
	must(t, err)
	defer donor.Close()
	must(t, unix.Fallocate(int(donor.Fd()), 0, 0, 3*4096))
	g.Poll()
	g0 := g.Generation()
	// struct move_extent: reserved u32, donor_fd u32, orig_start, donor_start, len, moved_len u64.
	var me [40]byte
	binary.NativeEndian.PutUint32(me[4:], uint32(donor.Fd()))
	binary.NativeEndian.PutUint64(me[24:], 1)
	const ext4IocMoveExt = 0xc028660f
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, orig.Fd(), ext4IocMoveExt, uintptr(unsafe.Pointer(&me[0]))); e != 0 {
		t.Skipf("EXT4_IOC_MOVE_EXT: %v", e)
	}
	g.Poll()
	t.Logf("EXT4_IOC_MOVE_EXT moved %d block(s): generation moved %v, NeedStat %v, PathUnchanged %v",
		binary.NativeEndian.Uint64(me[32:]), g.Generation() != g0, g.NeedStat(victim), g.PathUnchanged(victim))
}
