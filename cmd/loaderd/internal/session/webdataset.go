// SPDX-License-Identifier: Apache-2.0

package session

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/fresh"
	"github.com/nvfeed/nvfeed/bmap/wds"
	"github.com/nvfeed/nvfeed/loader"
)

// Bounds of a webdataset open's ext (OpenParams.Ext).
const (
	MaxExt      = wds.MaxOutputs // ext entries
	MaxExtBytes = 256            // bytes of one entry
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
		return nil, nil, hiddenErr(path, err)
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

// webDataset returns p's selection of d, a webdataset dataset, made
// for this session: wds.Map.Select judges each pattern of the map's
// index once and reads no record, so no selection is kept for others
// (none can be crowded out). p's webdataset arguments must agree with d:
// required for a webdataset, refused for another dataset.
func (d *dataset) webDataset(p OpenParams) (*loader.WebDataset, error) {
	switch {
	case d.wds == nil && (p.Ext != nil || p.MissingComponentBehavior != "" || p.CaseSensitiveExtensions != nil):
		return nil, fmt.Errorf("%w: %w: dataset %s is a %s dataset: ext, missing_component_behavior and case_sensitive_extensions are for webdataset datasets", ErrInvalid, ErrWebDatasetArgs, d.name, d.m.Reader)
	case d.wds == nil:
		return nil, nil
	case len(p.Ext) == 0:
		return nil, fmt.Errorf("%w: %w: dataset %s is a webdataset: ext is required (one entry per output, e.g. [\"jpg\", \"cls\"])", ErrInvalid, ErrWebDatasetArgs, d.name)
	}
	_, opts := p.selectionKey()
	v, err := d.wds.Select(opts)
	var w *loader.WebDataset
	if err == nil {
		w, err = loader.NewWebDataset(v)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: dataset %s: %w", ErrInvalid, d.name, err)
	}
	return w, nil
}

// selectionBytes is what a session's selection holds: its bitmap with
// skip (counted against Config.MaxSamplerBytes).
func selectionBytes(w *loader.WebDataset) int64 {
	if w == nil {
		return 0
	}
	return w.View().Bytes()
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

// skippedOf returns the samples a webdataset session's skip left out and,
// per output, how many of them lack it; 0 and nil when none (or another
// dataset's session).
func skippedOf(w *loader.WebDataset) (int, []int) {
	if w == nil {
		return 0, nil
	}
	n, lacking := w.View().Skipped()
	if n == 0 {
		return 0, nil
	}
	return n, lacking
}

// openWebDataset registers webdataset map w as dataset name: its tars
// (w.Shards) as a file map's samples are (guard, trust, warnings), and
// the map, read in place, closed with the registration.
func openWebDataset(name string, id uint64, w *wds.Map, trust fresh.Trust, background bool, log *slog.Logger) *dataset {
	d := openDataset(name, id, w.Shards, trust, background, log)
	d.wds = w
	d.summarise(log) // its samples', not its tars'
	log.Info("session: webdataset registered", "dataset", name, "samples", w.Len(), "components", w.Components(), "tars", len(w.Shards.Samples), "map_bytes", w.Bytes(),
		"index_bytes", w.IndexBytes())
	return d
}
