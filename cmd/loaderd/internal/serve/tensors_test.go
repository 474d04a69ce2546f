// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/npy"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader"
)

// TestNumpyOnTheWire: what a client of a numpy dataset gets, as msgpack:
// GET /v1/datasets and the open response name the reader (and the
// dtype), and each batch, by request and in a stream, carries dtype and
// one shape per sample, a 0-d array's as an empty array (not nil). A file
// dataset's batches carry neither key.
func TestNumpyOnTheWire(t *testing.T) {
	root := t.TempDir()
	shapes := map[string][]int64{"a.npy": {2, 3}, "b.npy": nil, "c.npy": {0, 5}, "d.npy": {4}}
	for name, shape := range shapes {
		h, err := npy.Encode(npy.Header{DType: npy.Uint16, Shape: shape})
		if err != nil {
			t.Fatal(err)
		}
		n := int64(2)
		for _, d := range shape {
			n *= d
		}
		if err := os.WriteFile(filepath.Join(root, name), append(h, make([]byte, n)...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m, err := bmap.Build(context.Background(), root, bmap.BuildOptions{Reader: bmap.ReaderNumpy})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "d.sock")
	serveWith(t, m, Config{SessionTimeout: time.Minute}, Listen{Socket: sock})
	c := unixClient(sock)

	var ds map[string][]map[string]any
	if code, raw := c.call(t, "GET", "/v1/datasets", nil, &ds); code != 200 {
		t.Fatalf("datasets: %d %s", code, raw)
	}
	if d := ds["datasets"][0]; d["reader"] != "numpy" || d["dtype"] != "<u2" {
		t.Errorf("datasets: reader %v dtype %v, want numpy and <u2", d["reader"], d["dtype"])
	}
	var open wire.OpenResponse
	if code, raw := c.call(t, "POST", "/v1/sessions", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 2, NumShards: 1}}}, &open); code != 200 {
		t.Fatalf("open: %d %s", code, raw)
	}
	if open.Reader != "numpy" {
		t.Errorf("open: reader %q, want numpy", open.Reader)
	}
	// By request: the raw map, so that nil and [] differ.
	var next map[string]any
	if code, raw := c.call(t, "POST", "/v1/sessions/"+open.ID+"/next", nil, &next); code != 200 {
		t.Fatalf("next: %d %s", code, raw)
	}
	want := []any{[]any{int8(2), int8(3)}, []any{}} // a.npy, b.npy (0-d)
	if next["dtype"] != "<u2" || !sameShapes(next["shapes"], want) {
		t.Errorf("batch 0: dtype %#v shapes %#v, want <u2 and %v", next["dtype"], next["shapes"], want)
	}
	// In a stream: the next batch, c.npy (empty) and d.npy.
	f := &fixture{sock: sock}
	sc := f.openStream(t, open.ID, &wire.StreamRequest{Keep: []int{}})
	defer sc.conn.Close()
	r, ok := sc.recv(10 * time.Second)
	if !ok || r.DType != "<u2" || !reflect.DeepEqual(r.Shapes, [][]int64{{0, 5}, {4}}) || r.Lengths[1] != 8 {
		t.Errorf("stream frame: %+v, want dtype <u2, shapes [[0 5] [4]], d.npy's 8 bytes", r)
	}

	// A file dataset: reader "file", no dtype or shapes keys.
	froot := t.TempDir()
	for i := range 3 {
		p := filepath.Join(froot, "c", string(rune('a'+i))+".jpg")
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte("jpeg bytes"), 0o644)
	}
	fsock := filepath.Join(t.TempDir(), "f.sock")
	serveWith(t, testfs.MapDir(t, froot), Config{SessionTimeout: time.Minute}, Listen{Socket: fsock})
	fc := unixClient(fsock)
	if code, raw := fc.call(t, "POST", "/v1/sessions", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 2, NumShards: 1}}}, &open); code != 200 {
		t.Fatalf("open: %d %s", code, raw)
	}
	if open.Reader != "file" {
		t.Errorf("file dataset: open reader %q", open.Reader)
	}
	_, raw := fc.call(t, "POST", "/v1/sessions/"+open.ID+"/next", nil, nil)
	var fnext map[string]any
	if err := msgpack.Unmarshal(raw, &fnext); err != nil {
		t.Fatal(err)
	}
	if _, has := fnext["dtype"]; has {
		t.Errorf("file dataset's batch has dtype: %v", fnext)
	}
	if _, has := fnext["shapes"]; has || fnext["offsets"] == nil {
		t.Errorf("file dataset's batch: %v, want offsets and no shapes", fnext)
	}
}

// sameShapes compares decoded msgpack shapes with want, numbers by value
// (msgpack picks the smallest integer type) and [] apart from nil.
func sameShapes(got any, want []any) bool {
	g, ok := got.([]any)
	if !ok || len(g) != len(want) {
		return false
	}
	for i := range g {
		gs, ok := g[i].([]any)
		ws := want[i].([]any)
		if !ok || gs == nil || len(gs) != len(ws) {
			return false
		}
		for j := range gs {
			if reflect.ValueOf(gs[j]).Convert(reflect.TypeFor[int64]()).Int() != reflect.ValueOf(ws[j]).Convert(reflect.TypeFor[int64]()).Int() {
				return false
			}
		}
	}
	return true
}
