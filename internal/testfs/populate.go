// SPDX-License-Identifier: Apache-2.0

package testfs

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"
)

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// Populate writes a dataset of awkward files under fs/dir in DALI layout:
// fragmented (frag/), every small size including inline candidates
// (sizes/), 12 MB files (large/), sparse (sparse/), preallocated unwritten
// tails inside and past EOF (prealloc/), an empty class (empty/), and
// non-samples (a .txt, a file in the root, spacer .dat files).
// 16 samples in all.
func Populate(t testing.TB, fs *FS, dir string, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	// Fragmentation: interleave O_DIRECT writes (allocated at write
	// time, no speculative preallocation) of the samples with a spacer file in the same directory (xfs puts
	// each directory in its own allocation group).
	WriteInterleaved(t, fs, []string{dir + "/frag/big0.jpg", dir + "/frag/spacer0.dat"}, [][]byte{randBytes(rng, 3<<20), randBytes(rng, 3<<20)})
	WriteInterleaved(t, fs, []string{dir + "/frag/big1.jpg", dir + "/frag/spacer1.dat"}, [][]byte{randBytes(rng, 1<<20+123), randBytes(rng, 1<<20)})
	fs.Sync(t)

	// Sizes, including inline candidates on ext4.
	for _, n := range []int{0, 1, 60, 511, 512, 4095, 4096, 4097, 110_000} {
		fs.WriteFile(t, dir+fmt.Sprintf("/sizes/f%06d.jpg", n), randBytes(rng, n))
	}
	fs.WriteFile(t, dir+"/large/a.jpg", randBytes(rng, 12<<20))
	fs.WriteFile(t, dir+"/large/b.JPEG", randBytes(rng, 12<<20+7))

	// Sparse: data, a hole, data, and a hole up to EOF.
	os.MkdirAll(fs.Path(dir, "sparse"), 0o755)
	os.MkdirAll(fs.Path(dir, "prealloc"), 0o755)
	sp, err := os.Create(fs.Path(dir, "sparse", "s.png"))
	if err != nil {
		t.Fatal(err)
	}
	sp.WriteAt(randBytes(rng, 5000), 0)
	sp.WriteAt(randBytes(rng, 7000), 1<<20+100)
	sp.Truncate(3 << 20)
	sp.Close()

	// Preallocated unwritten tail inside EOF, and past EOF (KEEP_SIZE).
	for i, mode := range []uint32{0, unix.FALLOC_FL_KEEP_SIZE} {
		f, err := os.Create(fs.Path(dir, "prealloc", fmt.Sprintf("p%d.jpg", i)))
		if err != nil {
			t.Fatal(err)
		}
		f.Write(randBytes(rng, 10_000))
		if err := unix.Fallocate(int(f.Fd()), mode, 0, 256<<10); err != nil {
			t.Fatalf("fallocate: %v", err)
		}
		f.Close()
	}
	os.MkdirAll(fs.Path(dir, "empty"), 0o755)
	fs.WriteFile(t, dir+"/sizes/notes.txt", []byte("not a sample"))
	fs.WriteFile(t, dir+"/root.jpg", []byte("not a sample either"))
	fs.Sync(t)
}

// WriteInterleaved writes data[i] to paths[i], 64 KiB at a time in turn,
// with O_DIRECT for the aligned part.
func WriteInterleaved(t testing.TB, fs *FS, paths []string, data [][]byte) {
	const chunk = 64 << 10
	buf := directio.AlignedBlock(chunk)
	files := make([]*os.File, len(paths))
	for i, p := range paths {
		os.MkdirAll(filepath.Dir(fs.Path(p)), 0o755)
		f, err := os.OpenFile(fs.Path(p), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_DIRECT, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		files[i] = f
	}
	for off := 0; ; off += chunk {
		wrote := false
		for i, f := range files {
			if off+chunk > len(data[i]) {
				continue
			}
			copy(buf, data[i][off:off+chunk])
			if _, err := f.WriteAt(buf, int64(off)); err != nil {
				t.Fatalf("%s: %v", paths[i], err)
			}
			wrote = true
		}
		if !wrote {
			break
		}
	}
	for i, p := range paths {
		aligned := len(data[i]) / chunk * chunk
		if aligned < len(data[i]) {
			f, err := os.OpenFile(fs.Path(p), os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.WriteAt(data[i][aligned:], int64(aligned))
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}
