// SPDX-License-Identifier: Apache-2.0

package session

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
)

// MaxFiles bounds an open's files: names of samples (DALI's files=).
const MaxFiles = 1 << 24

// resolveFiles returns the indices of names, DALI's files=, in order.
// Each is a path relative to the root or absolute under it, found by binary search in x.
// For missing names it returns the others in found and an ErrInvalid naming the first.
// under lists the missing names under the root, for authorizeMissing.
func resolveFiles(dataset string, ds *bmap.Map, x *fileIndex, names []string) (found []int32, under []string, err error) {
	order := x.sorted(ds)
	root := filepath.Clean(ds.Root)
	idx := make([]int32, 0, len(names))
	var missing []string
	for _, name := range names {
		rel := filepath.Clean(name)
		if filepath.IsAbs(rel) {
			r, err := filepath.Rel(root, rel)
			if err != nil || r == ".." || strings.HasPrefix(r, "../") {
				missing = append(missing, name)
				continue
			}
			rel = r
		}
		i, ok := lookup(ds, order, rel)
		if !ok {
			missing = append(missing, name)
			if filepath.IsLocal(rel) {
				under = append(under, rel)
			}
			continue
		}
		idx = append(idx, i)
	}
	if len(missing) > 0 {
		more := ""
		if len(missing) > 1 {
			more = fmt.Sprintf(" (and %d more)", len(missing)-1)
		}
		return idx, under, fmt.Errorf("%w: files: %q%s is not a sample of dataset %s (mapped from %s): name files relative to that root, or under it, as its map lists them",
			ErrInvalid, missing[0], more, dataset, ds.Root)
	}
	return idx, nil, nil
}

// authorizeMissing returns nil if c may learn that names under the root are not in the map.
// It opens each O_PATH as c; else it returns the refusal as for a mapped file.
func authorizeMissing(name string, ds *bmap.Map, rels []string, c Caller) error {
	cr := credOf(c)
	if cr == nil || len(rels) == 0 {
		return nil
	}
	var refusedErr error
	if err := cr.Do(func() error {
		for _, rel := range rels {
			fd, err := unix.Open(filepath.Join(ds.Root, rel), unix.O_PATH|unix.O_CLOEXEC, 0)
			if err == nil {
				unix.Close(fd)
				continue
			}
			if refused(err) {
				refusedErr = fmt.Errorf("%s: %w", listable(ds.Root, rel), err)
				return nil
			}
		}
		return nil
	}); err != nil {
		return refusal(name, c, err)
	}
	if refusedErr != nil {
		return refusal(name, c, refusedErr)
	}
	return nil
}

// fileIndex is a dataset's samples sorted by path, 4 bytes a sample, built at the first files= open.
type fileIndex struct {
	once  sync.Once
	order []int32 // sample indices by path; equal paths by index
}

// sorted returns x's order over ds, building it at the first call.
func (x *fileIndex) sorted(ds *bmap.Map) []int32 {
	x.once.Do(func() {
		x.order = make([]int32, len(ds.Samples))
		for i := range x.order {
			x.order[i] = int32(i)
		}
		slices.SortStableFunc(x.order, func(a, b int32) int {
			return strings.Compare(filepath.Clean(ds.Samples[a].Path), filepath.Clean(ds.Samples[b].Path))
		})
	})
	return x.order
}

// lookup returns the sample at path rel, the last where the map lists it twice.
func lookup(ds *bmap.Map, order []int32, rel string) (int32, bool) {
	k, _ := slices.BinarySearchFunc(order, rel, func(i int32, rel string) int {
		if c := strings.Compare(filepath.Clean(ds.Samples[i].Path), rel); c != 0 {
			return c
		}
		return -1 // equal paths: go past them, to the last
	})
	if k == 0 || filepath.Clean(ds.Samples[order[k-1]].Path) != rel {
		return 0, false
	}
	return order[k-1], true
}
