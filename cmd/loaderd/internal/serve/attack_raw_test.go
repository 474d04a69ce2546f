// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/extentinfo"
)

// ownerID is the throwaway user who owns the victim samples.
const ownerID = 43117

// moveExtent is struct move_extent of EXT4_IOC_MOVE_EXT.
type moveExtent struct {
	reserved   uint32
	donorFd    uint32
	origStart  uint64 // in blocks
	donorStart uint64
	len        uint64
	movedLen   uint64
}

// ext4IocMoveExt is _IOWR('f', 15, struct move_extent).
const ext4IocMoveExt = 3<<30 | uint32(unsafe.Sizeof(moveExtent{}))<<16 | 'f'<<8 | 15

// onThreadAs runs fn on a new OS thread whose real, effective, saved and
// filesystem ids are uid and gid, with no supplementary group and so no
// capability (raw system calls: this thread only); the thread ends with
// the call.
func onThreadAs(t *testing.T, uid, gid uint32, fn func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			errc <- fmt.Errorf("setgroups: %w", e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); e != 0 {
			errc <- fmt.Errorf("setresgid: %w", e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
			errc <- fmt.Errorf("setresuid: %w", e)
			return
		}
		errc <- fn()
	}()
	if err := <-errc; err != nil {
		t.Fatalf("as uid %d: %v", uid, err)
	}
}

// TestAttackBlocksMovedAway: a user who owns one sample of a raw-served
// dataset moves its blocks out from under the map without an event in
// the dataset's folders — (a) EXT4_IOC_MOVE_EXT into a donor file in
// their home, then truncating the donor, the sample kept open
// read-write; (b) a hard link in their home truncated to 0 — and root
// then writes a 0600 file that takes the freed blocks (checked with
// FIEMAP). Another user's gds and bam sessions never receive root's
// bytes: the owner's samples are served through the filesystem (their
// true bytes, or a failed sample) because their owner could change
// them, and /v1/datasets counts them as writable.
func TestAttackBlocksMovedAway(t *testing.T) {
	a := newAttackFS(t)
	home := a.fs.Path("home")
	must(t, os.Mkdir(home, 0o700))
	must(t, os.Chown(home, ownerID, ownerID))
	const size = 40960
	victims := map[string][]byte{"c0/moved.jpg": nil, "c1/linked.jpg": nil}
	for rel := range victims {
		b := bytes.Repeat([]byte("OWNERS-"+rel+"|"), size/len(rel))[:size]
		victims[rel] = b
		a.fs.WriteFile(t, "data/"+rel, b)
		must(t, os.Chown(a.fs.Path("data", rel), ownerID, ownerID))
	}
	m := a.build(t)
	mapped := map[string]*bmap.Sample{}
	for i := range m.Samples {
		if s := &m.Samples[i]; victims[s.Path] != nil {
			if s.Reason != bmap.Raw {
				t.Fatalf("%s: mapped %v, want raw", s.Path, s.Reason)
			}
			mapped[s.Path] = s
		}
	}
	sock := daemon(t, m)

	// The owner opens the sample read-write and makes the donor before
	// root fills the filesystem: the attack itself then needs no block.
	held, donor := -1, -1
	t.Cleanup(func() { unix.Close(held); unix.Close(donor) })
	onThreadAs(t, ownerID, ownerID, func() error {
		fd, err := unix.Open(a.fs.Path("data/c0/moved.jpg"), unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open the sample read-write: %w", err)
		}
		held = fd
		if donor, err = unix.Open(home+"/donor", unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600); err != nil {
			return fmt.Errorf("create the donor: %w", err)
		}
		if err := unix.Fallocate(donor, 0, 0, size); err != nil {
			return fmt.Errorf("fallocate the donor: %w", err)
		}
		return nil
	})

	// Root's file takes every free block twice: before the attack, so
	// that its extent tree's block is allocated while the samples still
	// hold theirs (a tree block allocated after the attack can land on a
	// freed block, which FIEMAP does not list and no write can take), and
	// after it, when the only free blocks are the ones the owner freed.
	// ext4's reserve for metadata is set to none first, so that root's
	// file can take it all.
	must(t, os.WriteFile("/sys/fs/ext4/"+filepath.Base(a.fs.Dev)+"/reserved_clusters", []byte("0"), 0))
	secretPath := a.fs.Path("vault/secret")
	f, err := os.OpenFile(secretPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	must(t, err)
	t.Cleanup(func() { f.Close() })
	fillAll := func() {
		// Until no block is left: 1 MiB writes, then 4 KiB ones after each
		// sync (delayed allocation's reservations give ENOSPC early, and
		// blocks freed by a transaction come back only once it commits),
		// until the filesystem has no free block or two rounds in a row
		// write nothing.
		fill := func(n int) int {
			chunk := bytes.Repeat(secret, n/len(secret))
			wrote := 0
			for {
				if _, err := f.Write(chunk); err != nil {
					if !errors.Is(err, unix.ENOSPC) {
						t.Fatal(err)
					}
					break
				}
				wrote++
			}
			f.Sync() // ENOSPC again, perhaps: what was written is on the device
			a.fs.Sync(t)
			return wrote
		}
		fill(1 << 20)
		for idle := 0; idle < 2; {
			if fill(4096) > 0 {
				idle = 0
				continue
			}
			var st unix.Statfs_t
			if err := unix.Statfs(a.fs.Dir, &st); err == nil && st.Bfree == 0 {
				break
			}
			idle++
		}
	}
	fillAll()
	var mp extentinfo.Mapper
	exts, err := mp.Extents(f)
	must(t, err)
	if len(exts) <= 4 { // ext4 keeps up to 4 extents in the inode, more in a tree block
		t.Fatalf("root's file has %d extents, so no extent tree block yet: the test cannot tell where its next one goes", len(exts))
	}

	// (a) and (b), as the owner.
	onThreadAs(t, ownerID, ownerID, func() error {
		me := moveExtent{donorFd: uint32(donor), len: size / 4096}
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(held), uintptr(ext4IocMoveExt), uintptr(unsafe.Pointer(&me))); e != 0 {
			return fmt.Errorf("EXT4_IOC_MOVE_EXT: %w", e)
		}
		if me.movedLen != size/4096 {
			return fmt.Errorf("EXT4_IOC_MOVE_EXT moved %d blocks, want %d", me.movedLen, size/4096)
		}
		if err := unix.Ftruncate(donor, 0); err != nil {
			return fmt.Errorf("truncate the donor: %w", err)
		}
		if err := unix.Link(a.fs.Path("data/c1/linked.jpg"), home+"/x"); err != nil {
			return fmt.Errorf("ln: %w", err)
		}
		return unix.Truncate(home+"/x", 0)
	})
	a.fs.Sync(t) // the freed blocks are reusable once the journal commits
	fillAll()
	must(t, f.Close())
	a.fs.Sync(t)
	sf, err := os.Open(secretPath)
	must(t, err)
	exts, err = mp.Extents(sf)
	sf.Close()
	must(t, err)
	for rel, s := range mapped {
		if !covers(exts, s.Extents) {
			t.Fatalf("root's file did not take %s's freed blocks: the test proves nothing", rel)
		}
	}

	// Another user reads, raw.
	for _, be := range []string{"gds", "bam"} {
		s, code, msg := connectAs(t, sock, nobodyWho).open(be)
		if code != http.StatusOK {
			t.Fatalf("%s: open as nobody: %d %s", be, code, msg)
		}
		got, failed := s.epoch(m) // fails the test if the secret is anywhere in the batch memory
		if b := got["c0/moved.jpg"]; !bytes.Equal(b, victims["c0/moved.jpg"]) {
			t.Errorf("%s: the moved sample: %d bytes, not its own", be, len(b))
		}
		if b := got["c1/linked.jpg"]; b != nil && !bytes.Equal(b, victims["c1/linked.jpg"]) {
			t.Errorf("%s: the truncated sample: %d bytes, neither its own nor failed", be, len(b))
		}
		t.Logf("%s: failed samples: %v", be, failed)
	}
	var ds wire.DatasetsResponse
	if code, msg := connectAs(t, sock, nobodyWho).call("GET", "/v1/datasets", nil, &ds); code != http.StatusOK {
		t.Fatalf("GET /v1/datasets: %d %s", code, msg)
	}
	d := ds.Datasets[0]
	if d.Writable == nil || d.Stale == nil || d.Fresh == nil {
		t.Fatalf("/v1/datasets: nobody, who may read the dataset, is not told its counts: %+v", d)
	}
	if *d.Writable+*d.Stale != len(victims) || *d.Fresh != len(m.Samples)-len(victims) {
		t.Errorf("/v1/datasets: fresh %d, stale %d, writable %d; want %d served through the filesystem", *d.Fresh, *d.Stale, *d.Writable, len(victims))
	}
}

// covers reports whether every device block of want lies in one of
// exts.
func covers(exts []extentinfo.Extent, want []extentinfo.Extent) bool {
	for _, w := range want {
		for b := w.Physical; b < w.Physical+w.Length; b += 4096 {
			in := false
			for _, e := range exts {
				if b >= e.Physical && b < e.Physical+e.Length {
					in = true
					break
				}
			}
			if !in {
				return false
			}
		}
	}
	return len(want) > 0
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
