// SPDX-License-Identifier: Apache-2.0

package cufile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/internal/samplefile"
)

// sizedReader is cuFile as far as sizes go: it takes any size and address
// (cuFile bounces what is not aligned), so it reads through the fd with
// O_DIRECT taken off, and records every read's size.
type sizedReader struct {
	preadReader
	sizes []int64
}

func (r *sizedReader) Read(_ int, fd int, dst uintptr, size, at int64) (int64, error) {
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err == nil {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl&^unix.O_DIRECT)
	}
	if err != nil {
		return 0, err
	}
	r.sizes = append(r.sizes, size)
	off := int64(dst - r.base())
	n, err := samplefile.PreadUpTo(fd, r.mem[off:off+size], at)
	return int64(n), err
}

// TestReadsTheDeviceRoom: a sample whose device room is its packed row in
// a dense batch (Request.DevRoom = its size) is read with exactly that
// many bytes, so the next row, right after it, is not written; a room of
// aligned length (or none given) is read whole; a file that grew is
// caught although its read came back full.
func TestReadsTheDeviceRoom(t *testing.T) {
	root := t.TempDir()
	for i := range 3 {
		p := filepath.Join(root, "c", fmt.Sprintf("s%d.jpg", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, bytes.Repeat([]byte{byte(i + 1)}, 5000), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m := testfs.MapDir(t, root)
	mem, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	r := &sizedReader{preadReader: preadReader{mem: mem}}
	b, err := New(m, 1, r, backend.Env{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, tt := range []struct {
		name  string
		rooms []int64 // each request's DevRoom
		at    []int64 // each request's device offset
		sizes []int64 // the reads' sizes
	}{
		{"dense rows", []int64{5000, 5000, 5000}, []int64{0, 5000, 10000}, []int64{5000, 5000, 5000}},
		{"aligned rooms", []int64{8192, 8192, 8192}, []int64{0, 8192, 16384}, []int64{8192, 8192, 8192}},
		{"no room given", []int64{0, 0, 0}, []int64{0, 8192, 16384}, []int64{8192, 8192, 8192}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for i := range mem {
				mem[i] = 0xA5
			}
			r.sizes = nil
			var reqs []backend.Request
			for i := range m.Samples {
				reqs = append(reqs, backend.Request{Index: i, Sample: &m.Samples[i], Dev: r.base() + uintptr(tt.at[i]), DevRoom: tt.rooms[i]})
			}
			if err := b.ReadBatch(context.Background(), reqs); err != nil {
				t.Fatal(err)
			}
			for i := range m.Samples {
				if got := mem[tt.at[i] : tt.at[i]+5000]; !bytes.Equal(got, bytes.Repeat([]byte{byte(i + 1)}, 5000)) {
					t.Errorf("sample %d differs at its device destination", i)
				}
			}
			if fmt.Sprint(r.sizes) != fmt.Sprint(tt.sizes) {
				t.Errorf("read sizes %v, want %v", r.sizes, tt.sizes)
			}
		})
	}
	f, err := os.OpenFile(filepath.Join(root, m.Samples[1].Path), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("grown"))
	f.Close()
	reqs := []backend.Request{{Index: 1, Sample: &m.Samples[1], Dev: r.base() + 5000, DevRoom: 5000}}
	if err := b.ReadBatch(context.Background(), reqs); !errors.Is(err, backend.ErrShortRead) || !strings.Contains(err.Error(), "5005 bytes now") {
		t.Errorf("a grown file read into its dense row: %v, want ErrShortRead saying it is 5005 bytes now", err)
	}
}

// TestReadsTensorData: a tensor sample is read from its data's offset in
// its file, exactly its size (the offset is not block-aligned: cuFile
// reads it through its own bounce buffers), into its device destination;
// the bytes after it are not written; a file that grew is caught by its
// size and named.
func TestReadsTensorData(t *testing.T) {
	const off, size = 300, 5000
	file := make([]byte, off+size)
	for i := range file {
		file[i] = byte(i*7 + i>>8)
	}
	root := t.TempDir()
	p := filepath.Join(root, "t.npy")
	if err := os.WriteFile(p, file, 0o644); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	unix.Stat(p, &st)
	m := &bmap.Map{Version: bmap.Version, Root: root, Reader: bmap.ReaderNumpy,
		Samples: []bmap.Sample{{Path: "t.npy", Offset: off, Size: size, Inode: st.Ino, Reason: bmap.UnknownPlace}}}
	mem, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	r := &sizedReader{preadReader: preadReader{mem: mem}}
	b, err := New(m, 1, r, backend.Env{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, dst := range []int64{off, 8192 + 17} { // a ragged room's data (at its phase), a dense row
		for i := range mem {
			mem[i] = 0xA5
		}
		r.sizes = nil
		reqs := []backend.Request{{Sample: &m.Samples[0], Dev: r.base() + uintptr(dst), DevRoom: backend.AlignUp(off+size) - off}}
		if err := b.ReadBatch(context.Background(), reqs); err != nil {
			t.Fatal(err)
		}
		if got := mem[dst : dst+size]; !bytes.Equal(got, file[off:]) {
			t.Errorf("at %d: the device holds other bytes than the file's data", dst)
		}
		if mem[dst+size] != 0xA5 || mem[dst-1] != 0xA5 {
			t.Errorf("at %d: a byte around the data written", dst)
		}
		if fmt.Sprint(r.sizes) != "[5000]" {
			t.Errorf("at %d: reads of %v bytes, want exactly [5000]", dst, r.sizes)
		}
	}
	os.WriteFile(p, append(file, 1), 0o644)
	reqs := []backend.Request{{Sample: &m.Samples[0], Dev: r.base() + off, DevRoom: 8192 - off}}
	if err := b.ReadBatch(context.Background(), reqs); !errors.Is(err, backend.ErrShortRead) || !strings.Contains(err.Error(), "t.npy") || !strings.Contains(err.Error(), "5301 bytes now, the map says 5300") {
		t.Errorf("a grown file: %v, want ErrShortRead naming t.npy, 5301 bytes now, the map says 5300", err)
	}
}
