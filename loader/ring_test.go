package loader

import (
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRingNoSpace: batch memory in a directory with less room than the
// ring may use is refused at once with ErrNoSpace naming the directory,
// not left to fail (SIGBUS) when a batch first touches a page; a ring that
// fits is made, and its memory is not allocated before it is used.
func TestRingNoSpace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=8m"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	defer unix.Unmount(dir, 0)
	_, err := NewRing(4, 4<<20, dir) // 16 MiB > 8
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("err = %v, want ErrNoSpace naming %s", err, dir)
	}
	r, err := NewRing(4, 1<<20, dir) // 4 MiB fits
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var st unix.Statfs_t
	unix.Statfs(dir, &st)
	if used := int64(st.Blocks-st.Bfree) * st.Bsize; used > 64<<10 {
		t.Errorf("a new ring already uses %d bytes of its directory: pages allocated before use", used)
	}
	copy(r.Slot(1), "batch")
	unix.Statfs(dir, &st)
	if used := int64(st.Blocks-st.Bfree) * st.Bsize; used == 0 {
		t.Errorf("a written slot uses no room: the ring is not in %s", dir)
	}
}
