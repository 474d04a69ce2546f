// SPDX-License-Identifier: Apache-2.0

package session

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/fresh"
	"github.com/nvfeed/nvfeed/bmap/wds"
	"github.com/nvfeed/nvfeed/loader"
)

// Bounds of a webdataset open's ext (OpenParams.Ext).
const (
	MaxExt      = wds.MaxOutputs // ext entries
	MaxExtBytes = 256            // bytes of one entry
	// MaxSelections is how many ext selections of one dataset are kept
	// for later sessions (each its bitmap with skip, N/8 bytes, and 512
	// KiB of room sizes); a selection past them is made for its session
	// alone and goes with it.
	MaxSelections = 16
	// MaxSelectionsPerOwner is how many of a dataset's kept selections
	// one owner (the uid whose open first made it) may hold: a new one
	// past them takes the place of the owner's own oldest, so no owner
	// can fill the table and make everyone else's selections a pass per
	// session, nor evict another's.
	MaxSelectionsPerOwner = 4
)

// ErrWebDatasetArgs is wrapped by the errors of webdataset arguments
// given for another dataset, or missing for a webdataset.
var ErrWebDatasetArgs = errors.New("webdataset arguments")

// LoadMap reads a map file: a webdataset map (version 3: wds.Read,
// copied into the daemon's own memory and checked whole) or another
// (bmap.Decode of the file's bytes); exactly one of the two is not nil.
// The file is opened once and read to its end: what its writer does to
// it afterwards (truncate, rewrite, replace) reaches neither map.
func LoadMap(path string) (*bmap.Map, *wds.Map, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	head := make([]byte, 12)
	if _, err := f.ReadAt(head, 0); err == nil && wds.IsVersion3(head) {
		w, err := wds.Read(f)
		if err != nil {
			return nil, nil, fmt.Errorf("wds: %s: %w", path, err)
		}
		return nil, w, nil
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, nil, fmt.Errorf("bmap: %s: %w", path, err)
	}
	if wds.IsVersion3(b) { // rewritten between the two reads
		return nil, nil, fmt.Errorf("bmap: %s: %w: the file changed while it was read", path, bmap.ErrCorrupt)
	}
	m, err := bmap.Decode(b)
	if err != nil {
		return nil, nil, fmt.Errorf("bmap: %s: %w", path, err)
	}
	return m, nil, nil
}

// checkWebDatasetArgs checks the webdataset arguments on their own:
// at most MaxExt entries of at most MaxExtBytes, a valid
// missing_component_behavior.
func (p OpenParams) checkWebDatasetArgs() error {
	if len(p.Ext) > MaxExt {
		return fmt.Errorf("%w: ext has %d entries, at most %d", ErrInvalid, len(p.Ext), MaxExt)
	}
	for i, e := range p.Ext {
		if len(e) > MaxExtBytes {
			return fmt.Errorf("%w: ext[%d] has %d bytes, at most %d", ErrInvalid, i, len(e), MaxExtBytes)
		}
	}
	if _, err := wds.ParseMissing(p.MissingComponentBehavior); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// selectionKey names p's selection: ext, case sensitivity and the
// missing behaviour, in a string no two selections share.
func (p OpenParams) selectionKey() (string, wds.Options) {
	miss, _ := wds.ParseMissing(p.MissingComponentBehavior) // checked
	o := wds.Options{Ext: p.Ext, CaseSensitive: p.CaseSensitiveExtensions == nil || *p.CaseSensitiveExtensions, Missing: miss}
	return fmt.Sprintf("%q %t %d", p.Ext, o.CaseSensitive, o.Missing), o
}

// selection is one ext selection of a webdataset dataset, made once
// (its pass over the samples) and shared by the sessions that ask for it.
type selection struct {
	once  sync.Once
	w     *loader.WebDataset
	err   error
	owner owner  // who first asked for it (kept selections: counted against its owner)
	made  uint64 // its place in the order the dataset's selections were kept
}

// webDataset returns p's selection of d, a webdataset dataset, for a
// session of o: kept for later sessions (up to MaxSelections a dataset,
// MaxSelectionsPerOwner of them first asked for by one owner: keep),
// made once while the sessions asking for it wait. p's webdataset
// arguments must agree with d: required for a webdataset, refused for
// another dataset.
func (d *dataset) webDataset(p OpenParams, o owner) (*loader.WebDataset, error) {
	switch {
	case d.wds == nil && (p.Ext != nil || p.MissingComponentBehavior != "" || p.CaseSensitiveExtensions != nil):
		return nil, fmt.Errorf("%w: %w: dataset %s is a %s dataset: ext, missing_component_behavior and case_sensitive_extensions are for webdataset datasets", ErrInvalid, ErrWebDatasetArgs, d.name, d.m.Reader)
	case d.wds == nil:
		return nil, nil
	case len(p.Ext) == 0:
		return nil, fmt.Errorf("%w: %w: dataset %s is a webdataset: ext is required (one entry per output, e.g. [\"jpg\", \"cls\"])", ErrInvalid, ErrWebDatasetArgs, d.name)
	}
	key, opts := p.selectionKey()
	d.selMu.Lock()
	s := d.sels[key]
	if s == nil {
		s = &selection{owner: o}
		d.keep(key, s)
	}
	d.selMu.Unlock()
	s.once.Do(func() {
		v, err := d.wds.Select(opts)
		if err == nil {
			s.w, err = loader.NewWebDataset(v)
		}
		if err != nil {
			s.err = fmt.Errorf("%w: dataset %s: %w", ErrInvalid, d.name, err)
		}
	})
	return s.w, s.err
}

// keep keeps new selection s under key, if it may: its owner holds
// fewer than MaxSelectionsPerOwner of the kept ones (else its own oldest
// goes) and the table has room (else s is its session's alone: no owner
// evicts another's). Under selMu.
func (d *dataset) keep(key string, s *selection) {
	var mine int
	oldest := ""
	for k, x := range d.sels {
		if x.owner != s.owner {
			continue
		}
		mine++
		if oldest == "" || x.made < d.sels[oldest].made {
			oldest = k
		}
	}
	if mine >= MaxSelectionsPerOwner {
		delete(d.sels, oldest)
	} else if len(d.sels) >= MaxSelections {
		return
	}
	if d.sels == nil {
		d.sels = map[string]*selection{}
	}
	d.selMade++
	s.made = d.selMade
	d.sels[key] = s
}

// samples returns how many samples the dataset's map has: a
// webdataset's samples, not its tars.
func (d *dataset) samples() int {
	if d.wds != nil {
		return d.wds.Len()
	}
	return len(d.m.Samples)
}

// reader names the dataset's DALI reader.
func (d *dataset) reader() string {
	if d.wds != nil {
		return "webdataset"
	}
	return d.m.Reader.String()
}

// selectionTerm is what the ranks of a job must also agree on for a
// webdataset: its selection (with skip it decides the samples).
func selectionTerm(p OpenParams) string {
	if p.Ext == nil {
		return ""
	}
	key, _ := p.selectionKey()
	return strings.TrimSpace(key)
}

// components returns a webdataset session's outputs a sample, 0 for
// another dataset's.
func components(w *loader.WebDataset) int {
	if w == nil {
		return 0
	}
	return w.Outputs()
}

// openWebDataset registers webdataset map w as dataset name: its tars
// (w.Shards) as a file map's samples are (guard, trust, warnings), and
// the map, read in place, closed with the registration.
func openWebDataset(name string, id uint64, w *wds.Map, trust fresh.Trust, background bool, log *slog.Logger) *dataset {
	d := openDataset(name, id, w.Shards, trust, background, log)
	d.wds = w
	log.Info("session: webdataset registered", "dataset", name, "samples", w.Len(), "components", w.Components(), "tars", len(w.Shards.Samples), "map_bytes", w.Bytes())
	return d
}
