// SPDX-License-Identifier: Apache-2.0

package raw

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/extentinfo"
	"github.com/nvfeed/nvfeed/loader/backend"
)

// describe renders a planned batch of one request as lines a person can
// check: "dev OFF+LEN -> buf MEMOFF" (in place), "dev OFF+LEN ->
// bounce[SRC:] -> buf FILEOFF+N" (copied after), "zero FILEOFF+N".
func describe(r *backend.Request, sc *scratch) []string {
	at := func(b []byte) uintptr {
		return uintptr(unsafe.Pointer(unsafe.SliceData(b))) - uintptr(unsafe.Pointer(unsafe.SliceData(r.Buf)))
	}
	var out []string
	for _, p := range sc.plans {
		if p.bounce {
			out = append(out, fmt.Sprintf("dev %d+%d -> bounce[%d:] -> buf %d+%d", p.op.off, len(p.op.buf), p.src, at(p.dst), len(p.dst)))
		} else {
			out = append(out, fmt.Sprintf("dev %d+%d -> buf %d", p.op.off, len(p.op.buf), at(p.op.buf)))
		}
	}
	for _, z := range sc.zeros {
		out = append(out, fmt.Sprintf("zero %d+%d", at(z), len(z)))
	}
	return out
}

type ext = extentinfo.Extent

func TestPlan(t *testing.T) {
	// A 4 KiB-block filesystem on a 512-byte-sector device.
	gds := planner{reqSize: 1 << 20, devSize: 1 << 30, devPath: "/dev/x", sector: 512, fsBlock: 4096}
	gds8k := planner{reqSize: 8192, devSize: 1 << 30, devPath: "/dev/x", sector: 512, fsBlock: 4096}
	bam := planner{reqSize: 4096, fixed: true, devSize: 1 << 30, devPath: "/dev/x", sector: 512, fsBlock: 4096}
	bam8k := planner{reqSize: 8192, fixed: true, devSize: 1 << 30, devPath: "/dev/x", sector: 512, fsBlock: 4096}
	tests := []struct {
		name    string
		p       planner
		size    int64
		extents []ext
		want    []string
	}{
		{"gds: one aligned extent, the tail read whole into the slack", gds, 10000, []ext{{Logical: 0, Physical: 40960, Length: 12288}},
			[]string{"dev 40960+12288 -> buf 0"}},
		{"gds: split at max_request", gds8k, 20000, []ext{{Logical: 0, Physical: 0, Length: 20480}},
			[]string{"dev 0+8192 -> buf 0", "dev 8192+8192 -> buf 8192", "dev 16384+4096 -> buf 16384"}},
		{"gds: 1 KiB-block extent off the 4 KiB grid is bounced", gds, 5000, []ext{{Logical: 0, Physical: 1024, Length: 5120}},
			[]string{"dev 0+8192 -> bounce[1024:] -> buf 0+5000"}},
		{"gds: a hole reads as zeros", gds, 8192, []ext{{Logical: 4096, Physical: 8192, Length: 4096}},
			[]string{"dev 8192+4096 -> buf 4096", "zero 0+4096"}},
		{"gds: an unwritten extent reads as zeros", gds, 4096, []ext{{Logical: 0, Physical: 8192, Length: 4096, Flags: extentinfo.FlagUnwritten}},
			[]string{"zero 0+4096"}},
		{"gds: a short run before a hole is bounced, not read over the hole", gds, 5096,
			[]ext{{Logical: 0, Physical: 0, Length: 2048}, {Logical: 4096, Physical: 20480, Length: 1024}},
			[]string{"dev 0+4096 -> bounce[0:] -> buf 0+2048", "dev 20480+4096 -> buf 4096", "zero 2048+2048"}},
		{"bam: whole 4 KiB blocks", bam, 10000, []ext{{Logical: 0, Physical: 4096, Length: 12288}},
			[]string{"dev 4096+4096 -> buf 0", "dev 8192+4096 -> buf 4096", "dev 12288+4096 -> buf 8192"}},
		{"bam: a block larger than the sample's piece is bounced", bam8k, 4096, []ext{{Logical: 0, Physical: 4096, Length: 4096}},
			[]string{"dev 0+8192 -> bounce[4096:] -> buf 0+4096"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &bmap.Sample{Path: "c/x.jpg", Size: tt.size, Extents: tt.extents}
			r := &backend.Request{Index: 3, Sample: s, Buf: make([]byte, backend.AlignUp(tt.size))}
			sc := &scratch{}
			defer sc.free()
			if err := tt.p.plan(0, r, sc); err != nil {
				t.Fatal(err)
			}
			if got := describe(r, sc); strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
			for _, op := range sc.ops {
				if op.off%backend.Align != 0 || len(op.buf)%backend.Align != 0 || uintptr(unsafe.Pointer(&op.buf[0]))%backend.Align != 0 {
					t.Errorf("op at %d (+%d) is not 4 KiB-aligned in offset, length and memory", op.off, len(op.buf))
				}
				if op.path != s.Path {
					t.Errorf("op names sample %q, want %q", op.path, s.Path)
				}
			}
		})
	}
}

// TestPlanTail: a read running past a sample's last byte may bring in
// only the file's own last filesystem block; gds cuts a longer one at the
// logical block holding that byte, bam bounces it.
func TestPlanTail(t *testing.T) {
	tests := []struct {
		name            string
		fixed           bool
		size            int64
		fsBlock, sector uint64
		physical        uint64 // the sample's one extent
		want            string
	}{
		{"gds, 4 KiB blocks: read whole into the slack", false, 10000, 4096, 512, 40960, "dev 40960+12288 -> buf 0"},
		{"gds, 4 KiB blocks, 4 KiB sectors", false, 10000, 4096, 4096, 40960, "dev 40960+12288 -> buf 0"},
		{"gds, 1 KiB blocks: cut at the sector", false, 1000, 1024, 512, 40960, "dev 40960+1024 -> buf 0"},
		{"gds, 1 KiB blocks: cut at the sector, mid-block", false, 1500, 1024, 512, 40960, "dev 40960+1536 -> buf 0"},
		{"gds, 1 KiB blocks: a 512-byte end is read to it", false, 3072, 1024, 512, 40960, "dev 40960+3072 -> buf 0"},
		{"gds, 1 KiB blocks: the own block reaches the 4 KiB end", false, 3500, 1024, 512, 40960, "dev 40960+4096 -> buf 0"},
		{"gds, 1 KiB blocks: a second 4 KiB, cut", false, 5000, 1024, 512, 40960, "dev 40960+5120 -> buf 0"},
		{"gds, 1 KiB blocks, sectors larger than blocks: bounced", false, 1000, 1024, 4096, 40960, "dev 40960+4096 -> bounce[0:] -> buf 0+1000"},
		{"gds, 1 KiB blocks off the 4 KiB grid: bounced, cut", false, 1000, 1024, 512, 41984, "dev 40960+2048 -> bounce[1024:] -> buf 0+1000"},
		{"bam, 4 KiB blocks: whole block into the slack", true, 1000, 4096, 512, 40960, "dev 40960+4096 -> buf 0"},
		{"bam, 1 KiB blocks: bounced", true, 1000, 1024, 512, 40960, "dev 40960+4096 -> bounce[0:] -> buf 0+1000"},
		{"bam, 1 KiB blocks: the own block reaches the block end", true, 3500, 1024, 512, 40960, "dev 40960+4096 -> buf 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := planner{reqSize: 1 << 20, fixed: tt.fixed, devSize: 1 << 30, devPath: "/dev/x", sector: tt.sector, fsBlock: tt.fsBlock}
			if tt.fixed {
				p.reqSize = 4096
			}
			length := (uint64(tt.size) + tt.fsBlock - 1) &^ (tt.fsBlock - 1)
			s := &bmap.Sample{Path: "c/x.jpg", Size: tt.size, Extents: []ext{{Logical: 0, Physical: tt.physical, Length: length}}}
			r := &backend.Request{Sample: s, Buf: make([]byte, backend.AlignUp(tt.size))}
			sc := &scratch{}
			defer sc.free()
			if err := p.plan(0, r, sc); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(describe(r, sc), "\n"); got != tt.want {
				t.Errorf("plan:\n%s\nwant:\n%s", got, tt.want)
			}
			for _, op := range sc.ops {
				if op.off%int64(tt.sector) != 0 || uint64(len(op.buf))%tt.sector != 0 {
					t.Errorf("op at %d (+%d) is not whole logical blocks", op.off, len(op.buf))
				}
			}
		})
	}
}

// TestPlanTensor: a tensor's data starts past its .npy header. In a
// ragged room that keeps the data's phase (Request.At) the header's block
// is read in place, into the slack before the data; a dense row (At 0,
// its neighbours' bytes around it) is judged by its address: congruent
// with the device, only its partial first and last blocks are bounced,
// every whole block between lands in place; at any other address all is
// bounced.
func TestPlanTensor(t *testing.T) {
	mem, err := unix.Mmap(-1, 0, 8<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	gds := planner{reqSize: 1 << 20, devSize: 1 << 30, devPath: "/dev/x", sector: 512, fsBlock: 4096}
	gds1k := planner{reqSize: 1 << 20, devSize: 1 << 30, devPath: "/dev/x", sector: 512, fsBlock: 1024}
	bam := planner{reqSize: 4096, fixed: true, devSize: 1 << 30, devPath: "/dev/x", sector: 512, fsBlock: 4096}
	tests := []struct {
		name        string
		p           planner
		offset      int64 // the data's offset in its file
		size        int64
		physical    uint64 // of the file's one extent, from its first byte
		bufAt, room int64  // Buf is mem[bufAt:bufAt+room]
		at          int64
		want        []string
		bounced     int // bytes
	}{
		{"gds: a ragged room at the data's phase reads the header's block into its slack", gds, 128, 10000, 40960, 0, 12288, 128,
			[]string{"dev 40960+12288 -> buf 0"}, 0},
		{"bam: the same, block by block", bam, 128, 10000, 40960, 0, 12288, 128,
			[]string{"dev 40960+4096 -> buf 0", "dev 45056+4096 -> buf 4096", "dev 49152+4096 -> buf 8192"}, 0},
		{"gds, 1 KiB blocks: only the data's own block is surely the file's: the first block bounced", gds1k, 1500, 3000, 40960, 0, 8192, 1500,
			[]string{"dev 40960+4096 -> bounce[1500:] -> buf 1500+2596", "dev 45056+512 -> buf 4096"}, 4096},
		{"gds, 1 KiB blocks: the header's block on the 4 KiB grid is read in place", gds1k, 100, 5000, 40960, 0, 8192, 100,
			[]string{"dev 40960+5120 -> buf 0"}, 0},
		{"gds, 1 KiB blocks off the 4 KiB grid: bounced, cut", gds1k, 1500, 3000, 41984, 0, 8192, 1500,
			[]string{"dev 40960+5632 -> bounce[2524:] -> buf 1500+3000"}, 5632},
		{"gds: a dense row congruent with the device: first and last blocks bounced", gds, 128, 10000, 40960, 128, 10000, 0,
			[]string{"dev 40960+4096 -> bounce[128:] -> buf 0+3968", "dev 45056+4096 -> buf 3968", "dev 49152+4096 -> bounce[0:] -> buf 8064+1936"}, 8192},
		{"gds: a 3 MiB dense row: split at max_request, two blocks bounced", gds, 128, 3 << 20, 40960, 128, 3 << 20, 0,
			[]string{"dev 40960+4096 -> bounce[128:] -> buf 0+3968", "dev 45056+1048576 -> buf 3968", "dev 1093632+1048576 -> buf 1052544",
				"dev 2142208+1044480 -> buf 2101120", "dev 3186688+4096 -> bounce[0:] -> buf 3145600+128"}, 8192},
		{"gds: a dense row at another phase is bounced whole", gds, 128, 10000, 40960, 100, 10000, 0,
			[]string{"dev 40960+12288 -> bounce[128:] -> buf 0+10000"}, 12288},
		{"bam: a dense row congruent with the device", bam, 128, 10000, 40960, 128, 10000, 0,
			[]string{"dev 40960+4096 -> bounce[128:] -> buf 0+3968", "dev 45056+4096 -> buf 3968", "dev 49152+4096 -> bounce[0:] -> buf 8064+1936"}, 8192},
		{"gds: a dense row at phase 0 ending on a block", gds, 4096, 8192, 40960, 0, 8192, 0,
			[]string{"dev 45056+8192 -> buf 0"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fileLen := (uint64(tt.offset+tt.size) + tt.p.fsBlock - 1) &^ (tt.p.fsBlock - 1)
			s := &bmap.Sample{Path: "x.npy", Offset: tt.offset, Size: tt.size, Extents: []ext{{Logical: 0, Physical: tt.physical, Length: fileLen}}}
			r := &backend.Request{Sample: s, Buf: mem[tt.bufAt : tt.bufAt+tt.room : tt.bufAt+tt.room], At: tt.at}
			sc := &scratch{}
			defer sc.free()
			if err := tt.p.plan(0, r, sc); err != nil {
				t.Fatal(err)
			}
			if got := describe(r, sc); strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
			bounced, covered := 0, int64(0)
			for _, p := range sc.plans {
				if p.bounce {
					bounced += len(p.op.buf)
				}
				covered += int64(len(p.dst))
				if uintptr(unsafe.Pointer(&p.op.buf[0]))%backend.Align != 0 || p.op.off%backend.Align != 0 {
					t.Errorf("op at %d: not aligned in memory or on the device", p.op.off)
				}
				if !p.bounce {
					lo := uintptr(unsafe.Pointer(&p.op.buf[0])) - uintptr(unsafe.Pointer(&r.Buf[0]))
					if int64(lo)+int64(len(p.op.buf)) > int64(len(r.Buf)) {
						t.Errorf("op at %d reads past the request's room", p.op.off)
					}
				}
			}
			if bounced != tt.bounced || covered != tt.size {
				t.Errorf("%d bytes bounced, want %d; %d of the %d data bytes covered", bounced, tt.bounced, covered, tt.size)
			}
		})
	}
}

func TestPlanPastDeviceEnd(t *testing.T) {
	p := planner{reqSize: 1 << 20, devSize: 8192, devPath: "/dev/small"}
	s := &bmap.Sample{Path: "c/far.jpg", Size: 4096, Extents: []ext{{Logical: 0, Physical: 8192, Length: 4096}}}
	r := &backend.Request{Index: 7, Sample: s, Buf: make([]byte, 4096)}
	sc := &scratch{}
	defer sc.free()
	err := p.plan(0, r, sc)
	var se *backend.SampleError
	if !errors.As(err, &se) || se.Index != 7 || !strings.Contains(err.Error(), "c/far.jpg") || !strings.Contains(err.Error(), "past the end") || !strings.Contains(err.Error(), "/dev/small") {
		t.Fatalf("err = %v, want a SampleError naming the sample, the device and 'past the end'", err)
	}
	if len(sc.ops) != 0 {
		t.Errorf("%d reads planned past the end", len(sc.ops))
	}
}

func TestPlanServesCachedBlocks(t *testing.T) {
	c, err := newBlockCache(64*4096, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	block := make([]byte, 4096)
	for i := range block {
		block[i] = byte(i)
	}
	c.put(2, block) // device bytes [8192, 12288)
	p := planner{reqSize: 4096, fixed: true, cache: c, devSize: 1 << 20, devPath: "/dev/x", sector: 512, fsBlock: 4096}
	s := &bmap.Sample{Path: "c/x.jpg", Size: 6000, Extents: []ext{{Logical: 0, Physical: 8192, Length: 8192}}}
	r := &backend.Request{Sample: s, Buf: make([]byte, 8192)}
	sc := &scratch{}
	defer sc.free()
	if err := p.plan(0, r, sc); err != nil {
		t.Fatal(err)
	}
	if got := describe(r, sc); len(got) != 1 || got[0] != "dev 12288+4096 -> buf 4096" {
		t.Errorf("plan %q: want only the uncached block read", got)
	}
	for i := 0; i < 4096; i++ {
		if r.Buf[i] != byte(i) {
			t.Fatalf("cached block not copied in: byte %d = %d", i, r.Buf[i])
		}
	}
}

func BenchmarkPlanBatch(b *testing.B) {
	p := planner{reqSize: 4096, fixed: true, devSize: 1 << 40, devPath: "/dev/x", sector: 512, fsBlock: 4096}
	reqs := make([]backend.Request, 64)
	for i := range reqs {
		s := &bmap.Sample{Path: "c/x.jpg", Size: 110_000, Extents: []ext{{Logical: 0, Physical: uint64(i) << 20, Length: 112 << 10}}}
		reqs[i] = backend.Request{Sample: s, Buf: make([]byte, backend.AlignUp(s.Size))}
	}
	sc := &scratch{}
	defer sc.free()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		for j := range reqs {
			p.plan(j, &reqs[j], sc)
		}
		sc.reset()
	}
}
