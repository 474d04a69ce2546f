// SPDX-License-Identifier: Apache-2.0

package session

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/nvfeed/nvfeed/bmap/wds"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/loader"
)

// TestSelectionsBoundPerOwner: one uid that opens sessions with many
// junk ext lists cannot fill a webdataset's kept selections (so that
// another uid's selection is a full pass per session) nor evict
// another's: it only replaces its own oldest. Before, the first
// MaxSelections keys stayed for the dataset's life: a uid that asked
// first held them all.
func TestSelectionsBoundPerOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "session: opens as other uids (euid %d)", os.Geteuid())
	}
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	_, wm, err := LoadMap(scaleMap(t, dir, 1000))
	if err != nil {
		t.Fatal(err)
	}
	mgr := NewManager(Config{WebDatasets: map[string]*wds.Map{"w": wm}, MaxLockedBytes: 1 << 30, MaxSessions: 64, MaxSessionsPerUID: 64,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer mgr.Stop()
	open := func(c Caller, ext ...string) {
		p := OpenParams{Dataset: "w", Ext: ext, Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 8, NumShards: 1}, Backend: "file"}}
		o, err := mgr.Open(context.Background(), c, p)
		if err == nil {
			mgr.Close(c, o.ID)
		}
	}
	kept := func(ext ...string) bool {
		d, err := mgr.acquire("w")
		if err != nil {
			t.Fatal(err)
		}
		defer mgr.release(d)
		key, _ := OpenParams{Ext: ext}.selectionKey()
		d.selMu.Lock()
		defer d.selMu.Unlock()
		return d.sels[key] != nil
	}
	victim := Caller{UID: 43120, GID: 43120}
	attacker := Caller{UID: 43121, GID: 43121}
	late := Caller{UID: 43122, GID: 43122}
	open(victim, "jpg", "cls")
	for k := range 3 * MaxSelections {
		open(attacker, "jpg", fmt.Sprintf("junk%d", k))
	}
	open(late, "cls")
	for _, tc := range []struct {
		who string
		ext []string
	}{
		{"the victim's selection, made before the junk", []string{"jpg", "cls"}},
		{"a selection made after the junk", []string{"cls"}},
		{"the attacker's newest", []string{"jpg", fmt.Sprintf("junk%d", 3*MaxSelections-1)}},
	} {
		if !kept(tc.ext...) {
			t.Errorf("%s (%q) is not kept", tc.who, tc.ext)
		}
	}
	if kept("jpg", "junk0") {
		t.Errorf("the attacker's oldest is still kept: it holds more than %d", MaxSelectionsPerOwner)
	}
}
