// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/loader"
)

// datasetAs is what GET /v1/datasets tells c of "ds", as the keys it
// carries.
func datasetAs(t *testing.T, c *peerClient) map[string]any {
	t.Helper()
	var r map[string][]map[string]any
	if code, msg := c.call("GET", "/v1/datasets", nil, &r); code != http.StatusOK {
		t.Fatalf("GET /v1/datasets as uid %d: %d %s", c.w.uid, code, msg)
	}
	if len(r["datasets"]) != 1 || r["datasets"][0]["name"] != "ds" {
		t.Fatalf("GET /v1/datasets as uid %d: %v, want ds by name", c.w.uid, r)
	}
	return r["datasets"][0]
}

// metricsAs is GET /metrics as c.
func metricsAs(t *testing.T, c *peerClient) string {
	t.Helper()
	code, raw := c.c.call(t, "GET", "/metrics", nil, nil)
	if code != http.StatusOK {
		t.Fatalf("GET /metrics as uid %d: %d %s", c.w.uid, code, raw)
	}
	return string(raw)
}

// TestAttackDatasetsTellOnlyWhatCallerMayList: GET /v1/datasets and
// /metrics tell a caller only what the filesystem would. Files are added
// to a class folder others may search but not list (0711) and a sample
// there is rewritten: nobody and a uid with no account still see the
// counts of a dataset they may read, but not added (they could not list
// the folder); root sees the 2 files. The folder becomes 0700: they may
// no longer read the dataset and see its name, reader and freshness only,
// and no metric series of it; root sees everything. Before, added counted
// the files for everyone, and every count and series was everyone's.
func TestAttackDatasetsTellOnlyWhatCallerMayList(t *testing.T) {
	a := newAttackFS(t)
	m := a.build(t)
	sock := daemon(t, m)
	root := connectAs(t, sock, who{0, 0, nil})
	attackers := []*peerClient{connectAs(t, sock, nobodyWho), connectAs(t, sock, throwawayWho)}
	for _, c := range attackers {
		if d := datasetAs(t, c); fmt.Sprint(d["added"]) != "0" {
			t.Fatalf("uid %d before any change: %v, want added 0", c.w.uid, d)
		}
	}
	datasetAs(t, root)
	// Root reads a batch: the dataset's series appear in /metrics.
	var o wire.OpenResponse
	if code, msg := root.call("POST", "/v1/sessions", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 1}}}, &o); code != http.StatusOK {
		t.Fatalf("root's open: %d %s", code, msg)
	}
	if code, msg := root.call("POST", "/v1/sessions/"+o.ID+"/next", nil, nil); code != http.StatusOK {
		t.Fatalf("root's next: %d %s", code, msg)
	}

	cls := filepath.Join(a.root, "c1")
	if err := os.Chmod(cls, 0o711); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		os.WriteFile(filepath.Join(cls, fmt.Sprintf("1%02d.jpg", i)), bytes.Repeat([]byte("ADDED"), 100), 0o644)
	}
	if err := os.WriteFile(filepath.Join(cls, "000.jpg"), bytes.Repeat([]byte("REWRITTEN"), 700), 0o644); err != nil {
		t.Fatal(err)
	}
	a.fs.Sync(t)
	// The counts are counted again within the session's infoInterval.
	testenv.Eventually(t, "root told 2 files added to c1 and one rewritten", func() bool {
		d := datasetAs(t, root)
		return fmt.Sprint(d["added"]) == "2" && fmt.Sprint(d["stale"]) != "0"
	})
	for _, c := range attackers {
		d := datasetAs(t, c)
		t.Logf("uid %d, c1 0711: %v", c.w.uid, d)
		if _, ok := d["added"]; ok {
			t.Errorf("uid %d, who may not list c1, is told added %v", c.w.uid, d["added"])
		}
		if d["readable"] != true || d["samples"] == nil {
			t.Errorf("uid %d, who may read every sample, is not told the counts: %v", c.w.uid, d)
		}
	}

	if err := os.Chmod(cls, 0o700); err != nil {
		t.Fatal(err)
	}
	if d := datasetAs(t, root); fmt.Sprint(d["added"]) != "2" || d["samples"] == nil {
		t.Errorf("root after c1 became 0700: %v, want every count", d)
	}
	if !strings.Contains(metricsAs(t, root), `dataset="ds"`) {
		t.Errorf("root's /metrics has no series of ds")
	}
	for _, c := range attackers {
		d := datasetAs(t, c)
		t.Logf("uid %d, c1 0700: %v", c.w.uid, d)
		for k := range d {
			if k != "name" && k != "reader" && k != "freshness" && k != "readable" && k != "dtype" {
				t.Errorf("uid %d, who may not read ds, is told its %s: %v", c.w.uid, k, d[k])
			}
		}
		if d["readable"] != false {
			t.Errorf("uid %d, who may not read ds: readable %v", c.w.uid, d["readable"])
		}
		if mt := metricsAs(t, c); strings.Contains(mt, `dataset="ds"`) {
			t.Errorf("uid %d, who may not read ds, sees its metrics", c.w.uid)
		}
	}
}
