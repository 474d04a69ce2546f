// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"bytes"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// nextCases are frames of every kind the stream sends: a batch, a
// ragged and a failed one, a numpy dataset's, the end of an epoch, an
// error, a stop; and the sizes where msgpack's length forms change.
func nextCases() map[string]NextResponse {
	many := func(n int) []int64 {
		s := make([]int64, n)
		for i := range s {
			s[i] = int64(i) * 114688
		}
		return s
	}
	return map[string]NextResponse{
		"zero":              {},
		"batch":             {Epoch: 2, Iteration: 7, EpochBatches: 63, Slot: 3, Offsets: []int64{0, 4096}, Lengths: []int64{100, 3000}, Labels: []int32{1, -2}, Indices: []int32{9, 4}},
		"end of epoch":      {EndOfEpoch: true, Epoch: 1, EpochBatches: 63},
		"empty lists":       {Offsets: []int64{}, Lengths: []int64{}, Labels: []int32{}, Indices: []int32{}, Failed: []int{}, Errors: []string{}, Shapes: [][]int64{}},
		"failed":            {Slot: 1, Offsets: []int64{0, 0}, Lengths: []int64{5, 0}, Labels: []int32{0, 0}, Indices: []int32{0, 1}, Failed: []int{1}, Errors: []string{"/d/x.jpg: read: input/output error"}},
		"numpy":             {Offsets: []int64{0}, Lengths: []int64{64}, Labels: []int32{0}, Indices: []int32{0}, DType: "<f4", Shapes: [][]int64{{4, 4}, {}, nil}},
		"error":             {Error: "session abc: gone", ErrorStatus: 404, ErrorCode: "not_found"},
		"stopped":           {Stopped: true},
		"extremes":          {Epoch: math.MaxInt, Iteration: math.MinInt, Slot: -1, Offsets: []int64{math.MinInt64, math.MaxInt64}, Labels: []int32{math.MinInt32, math.MaxInt32}},
		"15 16 65535 65536": {Offsets: many(15), Lengths: many(16), Indices: make([]int32, 65535), Labels: make([]int32, 65536)},
		"strings 31 32 255 256 65535 65536": {Errors: []string{strings.Repeat("e", 31), strings.Repeat("e", 32),
			strings.Repeat("e", 255), strings.Repeat("e", 256), strings.Repeat("e", 65535), strings.Repeat("e", 65536)}, Failed: make([]int, 2)},
	}
}

// TestAppendNextFrameIsReflective: the stream's direct encoding of a
// frame is the reflective one byte for byte, so no client can tell.
func TestAppendNextFrameIsReflective(t *testing.T) {
	for name, r := range nextCases() {
		t.Run(name, func(t *testing.T) {
			checkNextFrame(t, r)
		})
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		checkNextFrame(t, randomNext(rng))
	}
}

// TestAppendNextFrameAppends: it appends to what dst holds, and a reused
// buffer gets a whole frame.
func TestAppendNextFrameAppends(t *testing.T) {
	r := nextCases()["failed"]
	want, err := AppendFrame([]byte("head"), &r)
	if err != nil {
		t.Fatal(err)
	}
	if got := AppendNextFrame([]byte("head"), &r); !bytes.Equal(got, want) {
		t.Fatalf("after a prefix:\n got %x\nwant %x", got, want)
	}
	buf := AppendNextFrame(nil, &NextResponse{Error: strings.Repeat("x", 500)})
	if got := AppendNextFrame(buf[:0], &r); !bytes.Equal(got, want[4:]) {
		t.Fatalf("into a reused buffer:\n got %x\nwant %x", got, want[4:])
	}
}

func checkNextFrame(t *testing.T, r NextResponse) {
	t.Helper()
	want, err := AppendFrame(nil, &r)
	if err != nil {
		t.Fatal(err)
	}
	if got := AppendNextFrame(nil, &r); !bytes.Equal(got, want) {
		t.Fatalf("%+v:\n got %x\nwant %x", r, got, want)
	}
}

func randomNext(rng *rand.Rand) NextResponse {
	n := rng.IntN(70)
	ints := func() []int64 {
		if rng.IntN(5) == 0 {
			return nil
		}
		s := make([]int64, n)
		for i := range s {
			s[i] = rng.Int64() >> rng.IntN(64)
		}
		return s
	}
	int32s := func() []int32 {
		if rng.IntN(5) == 0 {
			return nil
		}
		s := make([]int32, n)
		for i := range s {
			s[i] = rng.Int32() - math.MaxInt32/2
		}
		return s
	}
	r := NextResponse{EndOfEpoch: rng.IntN(2) == 0, Epoch: rng.IntN(1 << 20), Iteration: rng.IntN(1 << 30),
		EpochBatches: rng.IntN(100), Slot: rng.IntN(130) - 1, Offsets: ints(), Lengths: ints(), Labels: int32s(),
		Indices: int32s(), ErrorStatus: rng.IntN(3) * 200, Stopped: rng.IntN(4) == 0}
	if rng.IntN(3) == 0 {
		for range rng.IntN(4) {
			r.Failed = append(r.Failed, rng.IntN(n+1))
			r.Errors = append(r.Errors, strings.Repeat("é", rng.IntN(100)))
		}
		r.Error, r.ErrorCode = strings.Repeat("x", rng.IntN(300)), strings.Repeat("c", rng.IntN(20))
	}
	if rng.IntN(3) == 0 {
		r.DType = "<f4"
		for range rng.IntN(4) {
			r.Shapes = append(r.Shapes, ints())
		}
	}
	return r
}

// FuzzAppendNextFrame: for any frame the fuzzer makes, the direct
// encoding is the reflective one.
func FuzzAppendNextFrame(f *testing.F) {
	f.Add(uint64(1), uint64(2))
	f.Add(uint64(0), uint64(0))
	f.Fuzz(func(t *testing.T, a, b uint64) {
		checkNextFrame(t, randomNext(rand.New(rand.NewPCG(a, b))))
	})
}

// BenchmarkNextFrame: a batch of 64's frame, by reflection and directly.
func BenchmarkNextFrame(b *testing.B) {
	r := NextResponse{Epoch: 1, Iteration: 100, EpochBatches: 187, Slot: 3}
	for i := range 64 {
		r.Offsets = append(r.Offsets, int64(i)*114688)
		r.Lengths = append(r.Lengths, 110000+int64(i))
		r.Labels = append(r.Labels, int32(i%100))
		r.Indices = append(r.Indices, int32(6400+i))
	}
	var buf []byte
	b.Run("reflective", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf, _ = AppendFrame(buf[:0], &r)
		}
	})
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf = AppendNextFrame(buf[:0], &r)
		}
	})
}

// TestAppendNextFrameKnowsEveryField: AppendNextFrame writes each field
// of NextResponse by name; a field added to the type without it would be
// left out of every stream frame with no error. Every field must appear
// in a frame of nextCases (so TestAppendNextFrameIsReflective compares
// it), and this list names those AppendNextFrame writes.
func TestAppendNextFrameKnowsEveryField(t *testing.T) {
	written := []string{"EndOfEpoch", "Epoch", "Iteration", "EpochBatches", "Slot", "Offsets", "Lengths", "Labels", "Indices",
		"Failed", "Errors", "DType", "Shapes", "Error", "ErrorStatus", "ErrorCode", "Stopped"}
	typ := reflect.TypeFor[NextResponse]()
	var fields []string
	for i := range typ.NumField() {
		fields = append(fields, typ.Field(i).Name)
	}
	if !slices.Equal(fields, written) {
		t.Fatalf("NextResponse's fields %v, AppendNextFrame writes %v: write the new field in next.go, then list it here", fields, written)
	}
	for _, name := range fields {
		set := false
		for _, r := range nextCases() {
			set = set || !reflect.ValueOf(r).FieldByName(name).IsZero()
		}
		if !set {
			t.Errorf("no frame of nextCases sets %s: the comparison with the reflective encoding never sees it", name)
		}
	}
}
