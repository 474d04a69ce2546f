package uring

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/testenv"
)

func TestReadMany(t *testing.T) {
	r, err := New(8)
	if errors.Is(err, ErrUnsupported) {
		testenv.SkipPrivileged(t, "io_uring refused here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	path := filepath.Join(t.TempDir(), "f")
	os.WriteFile(path, data, 0o644)
	f, _ := os.Open(path)
	defer f.Close()
	buf, err := unix.Mmap(-1, 0, len(data), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	// 64 reads of 16 KiB through an 8-entry ring, plus one past EOF.
	const chunk = 16 << 10
	next, done, inflight := 0, 0, 0
	results := map[uint64]int32{}
	for done < 65 {
		for next < 65 && r.SQSpace() > 0 {
			off := next * chunk
			if next == 64 {
				r.PrepRead(int(f.Fd()), buf[:chunk], uint64(len(data)+4096), 64)
			} else {
				r.PrepRead(int(f.Fd()), buf[off:off+chunk], uint64(off), uint64(next))
			}
			next++
			inflight++
		}
		if err := r.Submit(1); err != nil {
			t.Fatal(err)
		}
		n := r.Reap(func(c CQE) { results[c.UserData] = c.Res })
		done += n
		inflight -= n
	}
	for i := uint64(0); i < 64; i++ {
		if results[i] != chunk {
			t.Fatalf("read %d: res %d", i, results[i])
		}
	}
	if results[64] != 0 {
		t.Errorf("read past EOF: res %d, want 0", results[64])
	}
	if !bytes.Equal(buf, data) {
		t.Error("bytes differ")
	}
	// A bad descriptor completes with -EBADF.
	r.PrepRead(-1, buf[:16], 0, 99)
	r.Submit(1)
	r.Reap(func(c CQE) {
		if c.UserData != 99 || c.Res != -int32(unix.EBADF) {
			t.Errorf("bad fd: %+v", c)
		}
	})
}
