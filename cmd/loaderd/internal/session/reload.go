// SPDX-License-Identifier: Apache-2.0

package session

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Reload outcomes (Reloaded.Outcome).
const (
	ReloadReplaced = "reloaded" // its map was read again; new sessions get it
	ReloadAdded    = "added"    // a dataset new to the daemon
	ReloadRemoved  = "removed"  // no longer named: new opens get 404
	ReloadFailed   = "failed"   // its map did not load: it keeps the one it had, if any (Error says why)
)

// Reloaded says what a reload did with one dataset.
type Reloaded struct {
	Dataset string
	Outcome string // ReloadReplaced, ReloadAdded, ReloadRemoved or ReloadFailed
	Samples int    // what new sessions are served (0: none)
	Error   string // why it failed (ReloadFailed)
}

// ErrNoMapFiles is returned by Reload when the manager was given maps, not
// map files (Config.MapFiles nil).
var ErrNoMapFiles = errors.New("no map files to read again")

// Reload reads every dataset's map file again and registers each that loads.
// New sessions get the new map; open sessions keep theirs until they end.
// A map that fails leaves its dataset as it was; a dataset no longer named is removed.
// It returns one Reloaded per dataset, sorted. Reloads run one at a time.
func (m *Manager) Reload() ([]Reloaded, error) {
	if m.cfg.MapFiles == nil {
		return nil, ErrNoMapFiles
	}
	m.reloadMu.Lock()
	defer m.reloadMu.Unlock()
	files, err := m.cfg.MapFiles()
	if err != nil {
		return nil, fmt.Errorf("session: reload: %w", err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("session: reload: no dataset named: keeping the registered ones")
	}
	var out []Reloaded
	loaded := map[string]*dataset{}
	for name, path := range files {
		mp, wm, err := LoadMap(path)
		if err != nil {
			m.log.Warn("session: reload: map not loaded, the dataset keeps the map it had", "dataset", name, "map", path, "err", err)
			out = append(out, Reloaded{Dataset: name, Outcome: ReloadFailed, Error: fmt.Sprintf("%s: %v", path, err)})
			continue
		}
		m.mu.Lock()
		id := m.nextID
		m.nextID++
		m.mu.Unlock()
		if wm != nil {
			loaded[name] = openWebDataset(name, id, wm, m.cfg.Trust, m.cfg.CheckInBackground, m.log)
		} else {
			loaded[name] = openDataset(name, id, mp, m.cfg.Trust, m.cfg.CheckInBackground, m.log)
		}
	}
	var idle []*dataset
	m.mu.Lock()
	for i, r := range out { // failed: what new sessions keep getting
		if d := m.data[r.Dataset]; d != nil {
			out[i].Samples = d.samples()
		}
	}
	for name, d := range loaded {
		outcome := ReloadAdded
		if old := m.data[name]; old != nil {
			outcome = ReloadReplaced
			if m.retireLocked(old) {
				idle = append(idle, old)
			}
		}
		m.data[name] = d
		out = append(out, Reloaded{Dataset: name, Outcome: outcome, Samples: d.samples()})
	}
	for name, old := range m.data {
		if _, named := files[name]; !named {
			delete(m.data, name)
			if m.retireLocked(old) {
				idle = append(idle, old)
			}
			out = append(out, Reloaded{Dataset: name, Outcome: ReloadRemoved})
		}
	}
	m.mu.Unlock()
	for _, d := range idle {
		m.closeRetired(d)
	}
	slices.SortFunc(out, func(a, b Reloaded) int { return strings.Compare(a.Dataset, b.Dataset) })
	for _, r := range out {
		if r.Outcome != ReloadFailed {
			m.log.Info("session: reload", "dataset", r.Dataset, "outcome", r.Outcome, "samples", r.Samples)
		}
	}
	return out, nil
}
