// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/session"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/loader"
)

// Native fuzz targets for every request decoder: each input either
// decodes (package wire) to a value that passes validation, or fails with
// an error answered 400 (wrapping wire.ErrMalformed or
// session.ErrInvalid), and never panics.

// seeds adds each value's msgpack, and a few hostile bodies, to f.
func seeds(f *testing.F, vs ...any) {
	for _, v := range vs {
		b, err := msgpack.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, b := range [][]byte{
		nil,
		{0xc0},
		{0x81, 0xa7, 'r', 'e', 'l', 'e', 'a', 's', 'e', 0xdd, 0xff, 0xff, 0xff, 0xff}, // release: array32 of 2^32-1 slots, no elements
		{0x81, 0xa5, 'e', 'p', 'o', 'c', 'h', 0xcf, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		bytes.Repeat([]byte{0x91}, 64),
	} {
		f.Add(b)
	}
}

// wantInvalid fails t unless err is nil or one answered 400: wrapping
// wire.ErrMalformed (the message) or session.ErrInvalid (its numbers).
func wantInvalid(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil && !errors.Is(err, wire.ErrMalformed) && !errors.Is(err, session.ErrInvalid) {
		t.Fatalf("%s: error %v wraps neither wire.ErrMalformed nor session.ErrInvalid", what, err)
	}
	if err != nil && status(err) != http.StatusBadRequest {
		t.Fatalf("%s: error %v would be answered %d, not 400", what, err, status(err))
	}
}

func ptr(n int) *int { return &n }

func FuzzOpenRequest(f *testing.F) {
	ra := 1
	seeds(f,
		wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 3, ShardID: 2, RandomShuffle: true, Seed: math.MaxUint64}}},
		wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 1}, PrefetchQueueDepth: new(3), ReleaseAfter: &ra, Backend: "raw", BackendOptions: map[string]any{"queue_depth": 64}}},
		wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 3}, State: &loader.State{Version: 1,
			Sampling: loader.Sampling{N: 97, ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 3}}, Epoch: math.MaxInt64, Batch: 8}}},
		wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 1}, Memory: "gpu", Device: math.MinInt64, GPUPath: "auto"}},
	)
	f.Fuzz(func(t *testing.T, b []byte) {
		var req wire.OpenRequest
		err := decode(httptest.NewRequest("POST", "/v1/sessions", bytes.NewReader(b)), &req, wire.MaxOpenBody)
		if err == nil {
			err = openParams(req).Validate()
		}
		wantInvalid(t, "open", err)
	})
}

func FuzzNextRequest(f *testing.F) {
	seeds(f, wire.NextRequest{}, wire.NextRequest{Release: []int{0, 3}, Epoch: ptr(2), Iteration: ptr(5)},
		wire.NextRequest{Epoch: ptr(math.MaxInt64), Iteration: ptr(0)}, wire.NextRequest{Release: make([]int, 300)})
	f.Fuzz(func(t *testing.T, b []byte) {
		var req wire.NextRequest
		at, err := decodePosition(httptest.NewRequest("POST", "/v1/sessions/x/next", bytes.NewReader(b)), &req, &req.Epoch, &req.Iteration)
		if err == nil {
			err = session.CheckSlots("release", req.Release)
		}
		if err == nil && at != nil {
			err = at.Validate()
		}
		wantInvalid(t, "next", err)
	})
}

func FuzzReleaseRequest(f *testing.F) {
	seeds(f, wire.ReleaseRequest{Slot: 2}, wire.ReleaseRequest{Slot: math.MinInt64}, map[string]any{"slot": "two"})
	f.Fuzz(func(t *testing.T, b []byte) {
		var req wire.ReleaseRequest
		err := decode(httptest.NewRequest("POST", "/v1/sessions/x/release", bytes.NewReader(b)), &req, wire.MaxSmallBody)
		if err == nil {
			err = session.CheckSlots("release", []int{req.Slot})
		}
		wantInvalid(t, "release", err)
	})
}

func FuzzStreamRequest(f *testing.F) {
	seeds(f, wire.StreamRequest{}, wire.StreamRequest{Epoch: ptr(1), Iteration: ptr(0), Keep: []int{1, 2}},
		wire.StreamRequest{Epoch: ptr(-1), Iteration: ptr(math.MaxInt64)}, wire.StreamRequest{Keep: []int{math.MaxInt64}})
	f.Fuzz(func(t *testing.T, b []byte) {
		var req wire.StreamRequest
		at, err := decodePosition(httptest.NewRequest("POST", "/v1/sessions/x/stream", bytes.NewReader(b)), &req, &req.Epoch, &req.Iteration)
		if err == nil {
			err = session.CheckStream(at, req.Keep)
		}
		wantInvalid(t, "stream", err)
	})
}

// frames is the control frames' wire form: each a 4-byte big-endian
// length and its msgpack.
func frames(vs ...any) []byte {
	var out []byte
	for _, v := range vs {
		b, _ := msgpack.Marshal(v)
		out = binary.BigEndian.AppendUint32(out, uint32(len(b)))
		out = append(out, b...)
	}
	return out
}

func FuzzStreamFrames(f *testing.F) {
	f.Add(frames(wire.StreamControl{Release: []int{0, 1}}, wire.StreamControl{Stop: true, Keep: []int{2}}))
	f.Add(frames(wire.StreamControl{Release: []int{-1}}))
	f.Add(frames(map[string]any{"release": "all"}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 9, 0x81})
	f.Add(append([]byte{0, 0, 0, 14}, 0x81, 0xa7, 'r', 'e', 'l', 'e', 'a', 's', 'e', 0xdd, 0xff, 0xff, 0xff, 0xff))
	f.Fuzz(func(t *testing.T, b []byte) {
		rd := bufio.NewReader(bytes.NewReader(b))
		var buf []byte
		for {
			var err error
			if buf, err = wire.ReadFrame(rd, buf); err != nil {
				if !errors.Is(err, io.EOF) {
					wantInvalid(t, "frame", err)
				}
				return
			}
			if _, err := decodeControl(buf); err != nil {
				wantInvalid(t, "control frame", err)
				return
			}
		}
	})
}
