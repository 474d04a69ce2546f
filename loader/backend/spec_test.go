// SPDX-License-Identifier: Apache-2.0

package backend

import (
	"errors"
	"strings"
	"testing"
)

func testSpec() *Spec {
	return &Spec{Name: "x", Options: []Option{
		{Name: "queue_depth", Kind: Int, Default: int64(32), Min: 1, Max: 64},
		{Name: "block_size", Kind: Int, Default: int64(4096), Min: 4096, Max: 1 << 20, Multiple: 4096},
		{Name: "direct", Kind: Bool, Default: false},
		{Name: "engine", Kind: Enum, Default: "auto", Choices: []string{"auto", "uring"}},
	}}
}

func TestResolve(t *testing.T) {
	tests := []struct {
		in   map[string]any
		want map[string]any // nil: an error is expected
		msg  string
	}{
		{nil, map[string]any{"queue_depth": int64(32), "block_size": int64(4096), "direct": false, "engine": "auto"}, ""},
		{map[string]any{"queue_depth": int8(7), "direct": true, "engine": "uring"}, map[string]any{"queue_depth": int64(7), "direct": true, "engine": "uring"}, ""},
		{map[string]any{"queue_depth": "16", "direct": "true", "block_size": "8192"}, map[string]any{"queue_depth": int64(16), "direct": true, "block_size": int64(8192)}, ""},
		{map[string]any{"queue_depth": uint64(64), "block_size": 8192.0}, map[string]any{"queue_depth": int64(64), "block_size": int64(8192)}, ""},
		{map[string]any{"queue_depth": 0}, nil, "queue_depth: 0 not in [1, 64]"},
		{map[string]any{"queue_depth": 1.5}, nil, "1.5 is not an integer"},
		{map[string]any{"queue_depth": "many"}, nil, `"many" is not an integer`},
		{map[string]any{"block_size": 5000}, nil, "5000 is not a multiple of 4096"},
		{map[string]any{"direct": 1}, nil, "is not true or false"},
		{map[string]any{"engine": "spdk"}, nil, "spdk is not one of auto, uring"},
		{map[string]any{"cache_mb": 1}, nil, `backend x has no option "cache_mb" (its options: queue_depth, block_size, direct, engine)`},
	}
	for _, tt := range tests {
		p, err := testSpec().Resolve(tt.in)
		if tt.want == nil {
			if !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("%v: err = %v, want ErrOptions mentioning %q", tt.in, err, tt.msg)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tt.in, err)
			continue
		}
		got := p.Map()
		for k, v := range tt.want {
			if got[k] != v {
				t.Errorf("%v: %s = %v (%T), want %v (%T)", tt.in, k, got[k], got[k], v, v)
			}
		}
		if len(got) != 4 {
			t.Errorf("%v: %d options resolved, want all 4", tt.in, len(got))
		}
	}
}
