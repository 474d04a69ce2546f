// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
)

// TestOpenOverTheWire: open requests as a client sends them (msgpack
// maps): a field with a default takes it when absent, and 0 where 0 is
// out of range is refused (400) naming the field and its range, never
// taken for the default; the ranks of a job are compared (409, "ranks
// disagree", naming the argument); the dataset's fingerprint comes back
// in the open response and GET /v1/datasets, and a reopen asking for
// another one is refused (409).
func TestOpenOverTheWire(t *testing.T) {
	f := start(t, time.Minute)
	base := func(more map[string]any) map[string]any {
		r := map[string]any{"dataset": "ds", "batch_size": 4, "num_shards": 2, "shard_id": 0}
		for k, v := range more {
			if v == nil {
				delete(r, k)
			} else {
				r[k] = v
			}
		}
		return r
	}
	var ids []string
	defer func() {
		for _, id := range ids {
			f.call(t, "DELETE", "/v1/sessions/"+id, nil, nil)
		}
	}()
	for _, tc := range []struct {
		name string
		req  map[string]any
		code int
		msg  string // the error says it; or, opened, the prefetch depth in effect ("2")
	}{
		{"unknown dataset", base(map[string]any{"dataset": "nope"}), 404, "nope"},
		{"num_shards absent", base(map[string]any{"num_shards": nil}), 400, "num_shards 0 not in [1, 2147483647]"},
		{"num_shards 0", base(map[string]any{"num_shards": 0}), 400, "num_shards 0 not in [1, 2147483647]"},
		{"num_shards past the samples", base(map[string]any{"num_shards": 1000}), 400, "num_shards 1000 not in [1, 97]"},
		{"prefetch_queue_depth absent", base(map[string]any{"prefetch_queue_depth": nil}), 200, "2"},
		{"prefetch_queue_depth nil", base(map[string]any{"prefetch_queue_depth": msgNil{}}), 200, "2"},
		{"prefetch_queue_depth 0", base(map[string]any{"prefetch_queue_depth": 0}), 400, "prefetch_queue_depth 0 not in [1, 64]"},
		{"prefetch_queue_depth 3", base(map[string]any{"prefetch_queue_depth": 3, "shard_id": 1}), 200, "3"},
		{"job_id too long", base(map[string]any{"job_id": strings.Repeat("j", 129)}), 400, "job_id of 129 bytes, at most 128"},
		{"fingerprint not hex", base(map[string]any{"fingerprint": "train"}), 400, `fingerprint "train" is not 32 lowercase hex digits`},
		{"another dataset's fingerprint", base(map[string]any{"fingerprint": strings.Repeat("ab", 16)}), 409, "has fingerprint " + f.m.Fingerprint()},
		{"its own fingerprint", base(map[string]any{"fingerprint": f.m.Fingerprint()}), 200, "2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var open wire.OpenResponse
			var e wire.ErrorResponse
			out := any(&e)
			if tc.code == 200 {
				out = &open
			}
			code := f.call(t, "POST", "/v1/sessions", tc.req, out)
			if code != tc.code {
				t.Fatalf("%d %q, want %d", code, e.Error, tc.code)
			}
			if code != 200 {
				if !strings.Contains(e.Error, tc.msg) {
					t.Fatalf("%q does not say %q", e.Error, tc.msg)
				}
				// Every refusal carries its machine-readable code too.
				if want := map[int]string{400: wire.CodeInvalid, 404: wire.CodeNotFound, 409: wire.CodeConflict}[code]; e.Code != want {
					t.Fatalf("code %q, want %q", e.Code, want)
				}
				return
			}
			ids = append(ids, open.ID)
			if got := strconv.Itoa(open.PrefetchQueueDepth); got != tc.msg {
				t.Errorf("prefetch_queue_depth %s in effect, want %s", got, tc.msg)
			}
			if open.Fingerprint != f.m.Fingerprint() {
				t.Errorf("open response fingerprint %q, want the map's %q", open.Fingerprint, f.m.Fingerprint())
			}
		})
	}
	var ds wire.DatasetsResponse
	if code := f.call(t, "GET", "/v1/datasets", nil, &ds); code != 200 || len(ds.Datasets) != 1 || ds.Datasets[0].Fingerprint != f.m.Fingerprint() {
		t.Errorf("datasets: %d %+v, want the map's fingerprint %s", code, ds, f.m.Fingerprint())
	}

	// Two ranks of one job: the second with another seed is refused.
	job := map[string]any{"job_id": "train-42", "random_shuffle": true, "seed": 12}
	var open wire.OpenResponse
	if code := f.call(t, "POST", "/v1/sessions", base(job), &open); code != 200 {
		t.Fatalf("rank 0: %d", code)
	}
	ids = append(ids, open.ID)
	var e wire.ErrorResponse
	code := f.call(t, "POST", "/v1/sessions", base(map[string]any{"job_id": "train-42", "random_shuffle": true, "seed": 13, "shard_id": 1}), &e)
	if code != 409 || e.Code != wire.CodeRankMismatch || !strings.HasPrefix(e.Error, "ranks disagree: ") || !strings.Contains(e.Error, "seed 13 (the job's: 12)") {
		t.Errorf("rank 1 with another seed: %d %q %q, want 409 rank_mismatch, ranks disagree naming seed", code, e.Code, e.Error)
	}
	e = wire.ErrorResponse{}
	code = f.call(t, "POST", "/v1/sessions", base(job), &e)
	if code != 409 || e.Code != wire.CodeRankMismatch || !strings.Contains(e.Error, "shard_id 0 is already read by session "+open.ID) {
		t.Errorf("a second rank 0: %d %q %q, want 409 rank_mismatch naming the shard", code, e.Code, e.Error)
	}
	if code := f.call(t, "POST", "/v1/sessions", base(map[string]any{"job_id": "train-42", "random_shuffle": true, "seed": 12, "shard_id": 1}), &open); code != 200 {
		t.Errorf("rank 1 agreeing: %d", code)
	}
	ids = append(ids, open.ID)
}

// msgNil is sent as msgpack nil (a nil any in a map is dropped by base).
type msgNil struct{}

// MarshalMsgpack writes nil.
func (msgNil) MarshalMsgpack() ([]byte, error) { return []byte{0xc0}, nil }
