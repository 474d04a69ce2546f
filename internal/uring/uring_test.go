// SPDX-License-Identifier: Apache-2.0

package uring

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/testenv"
)

func TestReadMany(t *testing.T) {
	r := newRing(t, 8)
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

// Reads through every setup the loader uses: plain, SINGLE_ISSUER|
// DEFER_TASKRUN on a locked thread, and into registered buffers (READ_FIXED
// for the part inside them, plain READ for the rest). Bytes must be the
// file's in every case.
func TestSetups(t *testing.T) {
	data, f := patternFile(t, 4<<20)
	base := testenv.PinnedBytes(t)
	for _, tt := range []struct {
		name       string
		opts       Options
		registered int  // bytes at the start of the buffer registered (in two regions)
		deferred   bool // registered with DeferBuffers: pinned on first use
	}{
		{"plain", Options{}, 0, false},
		{"single issuer", Options{SingleIssuer: true}, 0, false},
		{"fixed buffers", Options{}, 3 << 20, false},
		{"single issuer, fixed buffers", Options{SingleIssuer: true}, len(data), false},
		{"deferred buffers", Options{}, 3 << 20, true},
		{"single issuer, deferred buffers", Options{SingleIssuer: true}, len(data), true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			r, err := NewWith(16, tt.opts)
			if errors.Is(err, ErrUnsupported) {
				testenv.SkipPrivileged(t, "io_uring refused here: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			buf, err := unix.Mmap(-1, 0, len(data), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Munmap(buf)
			// An earlier case's ring unpins its buffers in the kernel's
			// workqueue, after its Close.
			for wait := time.Now(); testenv.PinnedBytes(t) != base && time.Since(wait) < 5*time.Second; {
				time.Sleep(10 * time.Millisecond)
			}
			pinned := testenv.PinnedBytes(t)
			if tt.registered > 0 {
				half := tt.registered / 2
				register := r.RegisterBuffers
				if tt.deferred {
					register = r.DeferBuffers
				}
				if err := register([][]byte{buf[:half], buf[half:tt.registered]}); err != nil {
					t.Fatal(err)
				}
			}
			if tt.deferred {
				if got := testenv.PinnedBytes(t) - pinned; got != 0 {
					t.Errorf("deferred buffers: %d bytes pinned before any read", got)
				}
			}
			const chunk = 64 << 10
			fixed, next, done := 0, 0, 0
			for done < len(data)/chunk {
				for next < len(data)/chunk && r.SQSpace() > 0 {
					off := next * chunk
					idx := r.localTail & r.sqMask
					r.PrepRead(int(f.Fd()), buf[off:off+chunk], uint64(off), uint64(next))
					inside := off+chunk <= tt.registered && (off+chunk <= tt.registered/2 || off >= tt.registered/2)
					if got := r.sqes[idx].opcode == opReadFixed; got != inside {
						t.Fatalf("chunk at %d: READ_FIXED %v, want %v", off, got, inside)
					}
					if inside {
						fixed++
					}
					next++
				}
				if err := r.Submit(1); err != nil {
					t.Fatal(err)
				}
				done += r.Reap(func(c CQE) {
					if c.Res != chunk {
						t.Errorf("chunk %d: res %d", c.UserData, c.Res)
					}
				})
			}
			if !bytes.Equal(buf, data) {
				t.Error("bytes differ from the file's")
			}
			if got := testenv.PinnedBytes(t) - pinned; tt.registered > 0 && got != int64(tt.registered) {
				t.Errorf("after the reads %d bytes pinned, want the %d registered", got, tt.registered)
			}
			if tt.registered > 0 && fixed == 0 {
				t.Error("no read went through READ_FIXED")
			}
		})
	}
}

// Empty regions register nothing (the kernel refuses a zero-length iovec).
func TestRegisterBuffersEmpty(t *testing.T) {
	r := newRing(t, 4)
	if err := r.RegisterBuffers([][]byte{nil, {}}); err != nil || len(r.bufs) != 0 {
		t.Errorf("empty regions: %v, %d registered", err, len(r.bufs))
	}
}

// Deferred buffers are pinned piece by piece: a read pins the DeferChunk
// piece it lands in, not its whole region; a read across two pieces is
// a plain READ and pins nothing. Bytes are the file's either way.
func TestDeferBuffersPinPieces(t *testing.T) {
	const piece = DeferChunk
	data, f := patternFile(t, 2*piece)
	r := newRing(t, 4)
	buf, err := unix.Mmap(-1, 0, 3*piece, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	before := testenv.PinnedBytes(t)
	if err := r.DeferBuffers([][]byte{buf}); err != nil {
		if errors.Is(err, ErrUnsupported) {
			t.Skipf("no sparse buffer table here: %v", err)
		}
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		at     int // where in buf, and in the file, the read goes
		n      int
		fixed  bool
		pinned int64 // bytes pinned after it, in all
	}{
		{"inside the second piece", piece + 4096, 64 << 10, true, piece},
		{"across the first two pieces", piece - 4096, 8192, false, piece},
		{"inside the first piece", 0, 64 << 10, true, 2 * piece},
	} {
		idx := r.localTail & r.sqMask
		r.PrepRead(int(f.Fd()), buf[tt.at:tt.at+tt.n], uint64(tt.at), 0)
		if got := r.sqes[idx].opcode == opReadFixed; got != tt.fixed {
			t.Errorf("%s: READ_FIXED %v, want %v", tt.name, got, tt.fixed)
		}
		if err := r.Submit(1); err != nil {
			t.Fatal(err)
		}
		r.Reap(func(c CQE) {
			if int(c.Res) != tt.n {
				t.Errorf("%s: res %d, want %d", tt.name, c.Res, tt.n)
			}
		})
		if !bytes.Equal(buf[tt.at:tt.at+tt.n], data[tt.at:tt.at+tt.n]) {
			t.Errorf("%s: bytes differ from the file's", tt.name)
		}
		if got := testenv.PinnedBytes(t) - before; got != tt.pinned {
			t.Errorf("%s: %d bytes pinned, want %d", tt.name, got, tt.pinned)
		}
	}
}

// patternFile writes n bytes of a pattern to a file and opens it (closed
// at the test's end).
func patternFile(t *testing.T, n int) ([]byte, *os.File) {
	t.Helper()
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i*13 + i>>12)
	}
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return data, f
}

// newRing makes a plain ring of entries (closed at the test's end), or
// skips where io_uring is refused.
func newRing(t *testing.T, entries uint32) *Ring {
	t.Helper()
	r, err := New(entries)
	if errors.Is(err, ErrUnsupported) {
		testenv.SkipPrivileged(t, "io_uring refused here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}
