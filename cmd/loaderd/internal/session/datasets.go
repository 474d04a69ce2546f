package session

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/fresh"
)

// datasets are the registered datasets and their freshness guards: for
// each, one stat pass at registration, then an inotify watch (fresh.Guard)
// shared by all its sessions, so opening a session costs no pass over the
// dataset. It is read-only after openDatasets.
type datasets struct {
	maps   map[string]*bmap.Map
	guards map[string]*fresh.Guard // nil entry: none could be made (sessions check at open)
}

// openDatasets registers maps.
func openDatasets(maps map[string]*bmap.Map, log *slog.Logger) *datasets {
	d := &datasets{maps: maps, guards: map[string]*fresh.Guard{}}
	for name, ds := range maps {
		t0 := time.Now()
		g, err := fresh.Open(ds, fresh.Watch, log)
		if err != nil {
			log.Warn("session: dataset not checked at registration: raw sessions check it at open, access at every open",
				"dataset", name, "err", err)
			continue
		}
		d.guards[name] = g
		log.Info("session: dataset registered", "dataset", name, "samples", len(ds.Samples), "freshness", g.Method(),
			"seconds", time.Since(t0).Seconds())
	}
	return d
}

// get returns the named dataset, or ErrNotFound listing the registered ones.
func (d *datasets) get(name string) (*bmap.Map, error) {
	ds, ok := d.maps[name]
	if !ok {
		return nil, fmt.Errorf("%w: unknown dataset %q (registered: %s)", ErrNotFound, name, strings.Join(d.names(), ", "))
	}
	return ds, nil
}

// guard returns the dataset's freshness guard, nil when it has none.
func (d *datasets) guard(name string) *fresh.Guard { return d.guards[name] }

// names returns the registered names, sorted.
func (d *datasets) names() []string {
	names := make([]string, 0, len(d.maps))
	for n := range d.maps {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// close stops the watches.
func (d *datasets) close() error {
	var errs []error
	for _, g := range d.guards {
		errs = append(errs, g.Close())
	}
	return errors.Join(errs...)
}
