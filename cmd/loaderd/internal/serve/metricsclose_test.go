// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/loader"
)

// TestMetricsWhileSessionsClose: /metrics, which any client may read,
// reads every open session's backend counters; sessions of every
// built-in host backend opening, reading and closing (and one resumed
// with shuffle dali, replaying) under it give no 500, no race (-race)
// and no crash.
func TestMetricsWhileSessionsClose(t *testing.T) {
	a := newAttackFS(t)
	m := a.build(t)
	sock := daemon(t, m)
	c := connectAs(t, sock, nobodyWho)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if code, msg := c.call("GET", "/metrics", nil, nil); code != http.StatusOK {
				t.Errorf("/metrics: %d %s", code, msg)
				return
			}
		}
	}()
	args := loader.ReaderArgs{BatchSize: 2, NumShards: 1, RandomShuffle: true, Shuffle: loader.ShuffleDALI}
	st := loader.State{Version: loader.StateVersion, Sampling: loader.Sampling{N: len(m.Samples), ReaderArgs: args}, Epoch: 1 << 20}
	st.Sampling.InitialFill = loader.DefaultInitialFill
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		for _, be := range []string{"file", "gds", "bam"} {
			req := wire.OpenRequest{Dataset: "ds", Request: loader.Request{Backend: be, ReaderArgs: args}}
			if be == "bam" {
				req.State = &st
			}
			var o wire.OpenResponse
			if code, msg := c.call("POST", "/v1/sessions", req, &o); code != http.StatusOK {
				t.Fatalf("open %s: %d %s", be, code, msg)
			}
			if be != "bam" {
				if code, msg := c.call("POST", "/v1/sessions/"+o.ID+"/next", nil, nil); code != http.StatusOK {
					t.Fatalf("next %s: %d %s", be, code, msg)
				}
			}
			if code, msg := c.call("DELETE", "/v1/sessions/"+o.ID, nil, nil); code != http.StatusNoContent {
				t.Fatalf("close %s: %d %s", be, code, msg)
			}
		}
	}
	close(stop)
	wg.Wait()
}
