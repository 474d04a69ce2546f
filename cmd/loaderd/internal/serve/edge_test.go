// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bytes"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/loader"
)

// TestHugeNumbersRefused: numbers whose arithmetic once wrapped (an epoch
// of 2^63-1 in a next request on a session of 3 shards; a resume state
// near 2^63) are answered 400 naming the field, and the daemon stays up.
func TestHugeNumbersRefused(t *testing.T) {
	f := start(t, time.Minute)
	args := loader.ReaderArgs{BatchSize: 4, NumShards: 3}
	var open wire.OpenResponse
	if code := f.call(t, "POST", "/v1/sessions", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: args}}, &open); code != 200 {
		t.Fatalf("open: %d", code)
	}
	big, small := math.MaxInt64, 0
	for _, tt := range []struct {
		name        string
		epoch, iter int
		want        string
	}{
		{"epoch 2^63-1", big, 0, "epoch 9223372036854775807 not in [0, 2147483647]"},
		{"epoch 2^63-1 past the end", big, 1 << 20, "epoch 9223372036854775807"},
		{"epoch 2^31", 1 << 31, 0, "epoch 2147483648"},
		{"epoch -1", -1, 0, "epoch -1"},
		{"iteration 2^63-1", 0, big, "iteration 9223372036854775807 not in [0, 2147483647]"},
		{"iteration -2^63", 0, math.MinInt64, "iteration -9223372036854775808"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var e wire.ErrorResponse
			code := f.call(t, "POST", "/v1/sessions/"+open.ID+"/next", wire.NextRequest{Epoch: &tt.epoch, Iteration: &tt.iter}, &e)
			if code != 400 || !strings.Contains(e.Error, tt.want) {
				t.Errorf("next at (%d, %d): %d %q, want 400 naming %q", tt.epoch, tt.iter, code, e.Error, tt.want)
			}
		})
	}
	// The session still works.
	var nb wire.NextResponse
	if code := f.call(t, "POST", "/v1/sessions/"+open.ID+"/next", wire.NextRequest{Epoch: &small, Iteration: &small}, &nb); code != 200 || nb.Epoch != 0 || nb.Iteration != 0 {
		t.Errorf("next at (0, 0) after the refusals: %d %+v", code, nb)
	}
	smp := open.State.Sampling
	for _, tt := range []struct {
		name  string
		state loader.State
		want  string
	}{
		{"state epoch 2^63-1 at its end", loader.State{Version: loader.StateVersion, Sampling: smp, Epoch: big, Batch: 8}, "epoch 9223372036854775807 not in [0, 2147483647]"},
		{"state epoch 2^63-2", loader.State{Version: loader.StateVersion, Sampling: smp, Epoch: big - 1}, "epoch 9223372036854775806"},
		{"state batch 2^63-1", loader.State{Version: loader.StateVersion, Sampling: smp, Batch: big}, "batch 9223372036854775807 not in [0, 8]"},
		{"state num_shards 2^63-1", loader.State{Version: loader.StateVersion, Sampling: loader.Sampling{N: smp.N, ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: big}}}, "num_shards 9223372036854775807"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var e wire.ErrorResponse
			code := f.call(t, "POST", "/v1/sessions", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: args, State: &tt.state}}, &e)
			if code != 400 || !strings.Contains(e.Error, tt.want) {
				t.Errorf("open with state %+v: %d %q, want 400 naming %q", tt.state, code, e.Error, tt.want)
			}
		})
	}
	if code := f.call(t, "GET", "/healthz", nil, nil); code != 200 {
		t.Errorf("healthz: %d", code)
	}
}

// TestMalformedFramesAre400: a control frame the client got wrong ends
// its stream with an error frame of status 400 (a client's fault), not
// 500; so does a stream request out of range, before any upgrade.
func TestMalformedFramesAre400(t *testing.T) {
	f := start(t, time.Minute)
	for _, tt := range []struct {
		name  string
		frame []byte
		want  string
	}{
		{"not msgpack", []byte{0, 0, 0, 3, 0xc1, 0xc1, 0xc1}, "malformed control frame"},
		{"release not a list", frames(map[string]any{"release": "all"}), "malformed control frame"},
		{"release slot -1", frames(wire.StreamControl{Release: []int{-1}}), "release slot -1 not in [0, 129)"},
		{"array32 header of 2^32-1", append([]byte{0, 0, 0, 14}, 0x81, 0xa7, 'r', 'e', 'l', 'e', 'a', 's', 'e', 0xdd, 0xff, 0xff, 0xff, 0xff), "says more than"},
		{"over the frame limit", []byte{0x7f, 0xff, 0xff, 0xff}, "limit"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			open := f.openThreeSlots(t)
			defer f.call(t, "DELETE", "/v1/sessions/"+open.ID, nil, nil)
			s := f.openStream(t, open.ID, nil)
			defer s.conn.Close()
			s.conn.Write(tt.frame)
			for {
				r, ok := s.recv(5 * time.Second)
				if !ok {
					t.Fatal("no answer")
				}
				if r.Error != "" {
					if r.ErrorStatus != 400 || r.ErrorCode != wire.CodeInvalid || !strings.Contains(r.Error, tt.want) {
						t.Errorf("error frame %d %q %q, want 400 invalid naming %q", r.ErrorStatus, r.ErrorCode, r.Error, tt.want)
					}
					return
				}
			}
		})
	}
	t.Run("stream at epoch 2^63-1", func(t *testing.T) {
		f.client.Timeout = 10 * time.Second // a stream that starts would never end the read below
		open := f.openThreeSlots(t)
		big, zero := math.MaxInt64, 0
		var e wire.ErrorResponse
		body, _ := msgpack.Marshal(wire.StreamRequest{Epoch: &big, Iteration: &zero})
		req, _ := http.NewRequest("POST", "http://d/v1/sessions/"+open.ID+"/stream", bytes.NewReader(body))
		req.Header.Set("Upgrade", wire.StreamUpgrade)
		req.Header.Set("Connection", "Upgrade")
		resp, err := f.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		msgpack.Unmarshal(raw, &e)
		if resp.StatusCode != 400 || !strings.Contains(e.Error, "epoch 9223372036854775807") {
			t.Errorf("stream at epoch 2^63-1: %d %q, want 400 naming the epoch", resp.StatusCode, e.Error)
		}
	})
}
