// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// frame64 is a batch descriptor of 64 samples, as the stream sends it.
func frame64() wire.NextResponse {
	r := wire.NextResponse{Epoch: 3, Iteration: 117, EpochBatches: 188, Slot: 4}
	for i := 0; i < 64; i++ {
		r.Offsets = append(r.Offsets, int64(i)*114688+int64(i%3)*4096)
		r.Lengths = append(r.Lengths, 110000+int64(i)*37)
		r.Labels = append(r.Labels, int32(i%100))
		r.Indices = append(r.Indices, int32(i*97%12000))
	}
	return r
}

// BenchmarkFrameMarshal is the stream's per-batch encoding with the
// msgpack library.
func BenchmarkFrameMarshal(b *testing.B) {
	r := frame64()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := msgpack.Marshal(r); err != nil {
			b.Fatal(err)
		}
	}
}
