// SPDX-License-Identifier: Apache-2.0

package session

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/loader"
)

// TestValidateBounds: every number and string of an open request that
// needs no dataset, at and past each end of its range: the ends pass,
// past them is ErrInvalid naming the field, the value and the range.
func TestValidateBounds(t *testing.T) {
	ok := func(p *OpenParams) {}
	tests := []struct {
		name string
		edit func(p *OpenParams)
		want string // "" passes
	}{
		{"defaults", ok, ""},
		{"num_shards 0 is no default", func(p *OpenParams) { p.NumShards = 0 }, "num_shards 0 not in [1, 2147483647]"},
		{"num_shards negative", func(p *OpenParams) { p.NumShards = -1 }, "num_shards -1 not in [1, 2147483647]"},
		{"num_shards past int32", func(p *OpenParams) { p.NumShards = 1 << 31 }, "num_shards 2147483648 not in [1, 2147483647]"},
		{"num_shards max", func(p *OpenParams) { p.NumShards = 1<<31 - 1 }, ""},
		{"shard_id at num_shards", func(p *OpenParams) { p.NumShards, p.ShardID = 2, 2 }, "shard_id 2 not in [0, num_shards=2)"},
		{"shard_id negative", func(p *OpenParams) { p.ShardID = -1 }, "shard_id -1 not in [0, num_shards=1)"},
		{"batch_size 0", func(p *OpenParams) { p.BatchSize = 0 }, "batch_size 0 not in [1, 65536]"},
		{"batch_size max", func(p *OpenParams) { p.BatchSize = 65536 }, ""},
		{"batch_size past max", func(p *OpenParams) { p.BatchSize = 65537 }, "batch_size 65537 not in [1, 65536]"},
		{"initial_fill max", func(p *OpenParams) { p.InitialFill = 1 << 24 }, ""},
		{"initial_fill past max", func(p *OpenParams) { p.InitialFill = 1<<24 + 1 }, "initial_fill 16777217 not in [1, 16777216]"},
		{"shuffle", func(p *OpenParams) { p.Shuffle = "random" }, `shuffle "random"`},
		{"prefetch_queue_depth absent", func(p *OpenParams) { p.PrefetchQueueDepth = nil }, ""},
		{"prefetch_queue_depth 0 is no default", func(p *OpenParams) { p.PrefetchQueueDepth = new(0) }, "prefetch_queue_depth 0 not in [1, 64]"},
		{"prefetch_queue_depth 1", func(p *OpenParams) { p.PrefetchQueueDepth = new(1) }, ""},
		{"prefetch_queue_depth max", func(p *OpenParams) { p.PrefetchQueueDepth, p.ReleaseAfter = new(64), new(64) }, ""},
		{"prefetch_queue_depth max, release_after's default past its", func(p *OpenParams) { p.PrefetchQueueDepth = new(64) },
			"release_after 65 not in [0, 64] (its default, prefetch_queue_depth+1: give release_after)"},
		{"prefetch_queue_depth past max", func(p *OpenParams) { p.PrefetchQueueDepth = new(65) }, "prefetch_queue_depth 65 not in [1, 64]"},
		{"release_after 0", func(p *OpenParams) { p.ReleaseAfter = new(0) }, ""},
		{"release_after negative", func(p *OpenParams) { p.ReleaseAfter = new(-1) }, "release_after -1 not in [0, 64]"},
		{"release_after past max", func(p *OpenParams) { p.ReleaseAfter = new(65) }, "release_after 65 not in [0, 64]"},
		{"device_id negative", func(p *OpenParams) { p.Device = -1 }, "device_id -1 not in [0, 1023]"},
		{"device_id past max", func(p *OpenParams) { p.Device = 1024 }, "device_id 1024 not in [0, 1023]"},
		{"backend_options", func(p *OpenParams) {
			p.BackendOptions = map[string]any{}
			for i := range MaxBackendOptions + 1 {
				p.BackendOptions[string(rune('a'+i%26))+strings.Repeat("x", i)] = 1
			}
		}, "backend_options has 65 entries, at most 64"},
		{"job_id max", func(p *OpenParams) { p.JobID = strings.Repeat("j", MaxJobID) }, ""},
		{"job_id unicode", func(p *OpenParams) { p.JobID = "exp-π/seed 3" }, ""},
		{"job_id past max", func(p *OpenParams) { p.JobID = strings.Repeat("j", MaxJobID+1) }, "job_id of 129 bytes, at most 128"},
		{"job_id control", func(p *OpenParams) { p.JobID = "a\nb" }, `job_id "a\nb" has a control character (U+000A)`},
		{"job_id not UTF-8", func(p *OpenParams) { p.JobID = "a\xffb" }, "is not UTF-8"},
		{"fingerprint", func(p *OpenParams) { p.Fingerprint = "0123456789abcdef0123456789abcdef" }, ""},
		{"fingerprint short", func(p *OpenParams) { p.Fingerprint = "0123" }, `fingerprint "0123" is not 32 lowercase hex digits`},
		{"fingerprint upper", func(p *OpenParams) { p.Fingerprint = "0123456789ABCDEF0123456789abcdef" }, "is not 32 lowercase hex digits"},
		{"fingerprint long, cut in the message", func(p *OpenParams) { p.Fingerprint = strings.Repeat("z", 1<<16) }, "is not 32 lowercase hex digits"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := OpenParams{Dataset: "d", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 1, NumShards: 1}}}
			tc.edit(&p)
			err := p.Validate()
			if err == nil {
				if _, err = p.Options(); err != nil { // the loader's request, as Open checks it before any dataset
					err = fmt.Errorf("%w: %w", ErrInvalid, err)
				}
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "":
			case !errors.Is(err, ErrInvalid):
				t.Fatalf("%v, want ErrInvalid", err)
			case !strings.Contains(err.Error(), tc.want):
				t.Fatalf("%q does not say %q", err, tc.want)
			case len(err.Error()) > 400:
				t.Fatalf("a message of %d bytes: a client's string is not echoed whole", len(err.Error()))
			}
		})
	}
}
