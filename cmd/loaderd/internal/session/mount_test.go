// SPDX-License-Identifier: Apache-2.0

package session

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/loader"
)

// TestLazyAccessSharedMountReplacedSameID: class c0 is a mount of its
// own (a bind mount) when the dataset is registered. nobody's session A
// opens every sample. Root unmounts c0 and mounts a tmpfs over it; the
// new mount gets the freed mount ID, so its (ID, mount point) in the
// table is the same. A new session B's first batch opens c0's samples
// again and finds them gone (NeedStat). Before, the watch compared only
// the table's (ID, mount point) and B reused A's verdict.
func TestLazyAccessSharedMountReplacedSameID(t *testing.T) {
	asRoot(t)
	fs, m := classFolders(t, 2)
	c0dir := fs.Path("train", "c0")
	if err := unix.Mount(c0dir, c0dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount: %v", err)
	}
	mounted := true
	defer func() {
		for mounted {
			mounted = unix.Unmount(c0dir, unix.MNT_DETACH) == nil
		}
	}()
	d := watched(t, m)
	g, all := d.guard, allSamples(m)
	g.Wait()
	nob := Caller{UID: nobody, GID: nobody}
	A := d.access(nob)
	c0 := classOpens(d, nob, "c0/")
	if r := A(all); len(r) != 0 {
		t.Fatalf("A: %d refused", len(r))
	}
	c0()
	A(all)
	if n, _ := c0(); n != 0 {
		t.Fatalf("A's second batch opened c0's samples %d times, want 0", n)
	}
	var st unix.Statx_t
	unix.Statx(unix.AT_FDCWD, c0dir, 0, unix.STATX_MNT_ID, &st)
	before := st.Mnt_id
	if err := unix.Unmount(c0dir, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", c0dir, "tmpfs", 0, "mode=0755"); err != nil {
		mounted = false
		t.Fatalf("mount: %v", err)
	}
	unix.Statx(unix.AT_FDCWD, c0dir, 0, unix.STATX_MNT_ID, &st)
	t.Logf("mount ID at c0: %d before, %d after", before, st.Mnt_id)
	d.access(nob)(all)
	if n, stat := c0(); n != 4 || !stat {
		t.Errorf("B after c0's mount was replaced by a tmpfs: c0's samples opened %d times, NeedStat %v; want 4, true (the hidden files' raw extents are served)", n, stat)
	}
}

// TestLazyAccessMountDuringBatch: a gds batch of nobody's (class c0's
// four samples) is admitted, its samples opened as nobody; root then
// mounts a tmpfs over c0 before the batch's raw reads. The mount moves no
// sample's NeedStat, so the loader asks for the batch again (its marks
// moved since its Access) and reads it again: c0's samples fail, their
// paths leading nowhere. The next batch, c1's, is delivered exact. Before,
// c0's hidden files' raw extents were delivered.
func TestLazyAccessMountDuringBatch(t *testing.T) {
	asRoot(t)
	fs, m := classFolders(t, 2)
	d := watched(t, m)
	nob := Caller{UID: nobody, GID: nobody}
	admit := d.access(nob)
	hidden := fs.Path("train", "c0")
	mounted := false
	defer func() {
		if mounted {
			unix.Unmount(hidden, unix.MNT_DETACH)
		}
	}()
	var mountErr error
	// c1's batch is admitted only after c0's is delivered: its opens as
	// nobody would find c0 gone and mark c0's samples for a check.
	first := make(chan struct{})
	l, err := loader.New(context.Background(), m, loader.Options{
		ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 1},
		Backend:    "gds", Guard: d.guard, SkipErrors: true, PrefetchQueueDepth: 1,
		Cred: (*loader.Cred)(credOf(nob)),
		Access: func(samples []int) []loader.Refused {
			if strings.HasPrefix(m.Samples[samples[0]].Path, "c1/") {
				<-first
			}
			r := admit(samples)
			if !mounted {
				mountErr = unix.Mount("tmpfs", hidden, "tmpfs", 0, "mode=0755")
				mounted = mountErr == nil
			}
			return r
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for k := range 2 {
		b, err := l.Next(context.Background())
		if k == 0 {
			close(first)
		}
		if mountErr != nil {
			t.Fatalf("mount: %v", mountErr)
		}
		if err != nil {
			t.Fatal(err)
		}
		failed := map[int]bool{}
		for _, pos := range b.Failed {
			failed[pos] = true
		}
		for pos, i := range b.Indices {
			s := m.Samples[i]
			if strings.HasPrefix(s.Path, "c0/") {
				if !failed[pos] {
					t.Errorf("%s, hidden by a mount after its batch was admitted: delivered (%d bytes)", s.Path, b.Lengths[pos])
				}
				continue
			}
			want, err := os.ReadFile(fs.Path("train", s.Path))
			if err != nil {
				t.Fatal(err)
			}
			if failed[pos] || !bytes.Equal(b.Sample(pos), want) {
				t.Errorf("%s: failed %v, or its bytes differ from the file", s.Path, failed[pos])
			}
		}
		b.Release()
	}
}
