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

// resolveFiles returns the indices into ds.Samples of names (DALI's
// files=, in their order): each a path relative to the map's root or an
// absolute path under it, as mapped (no symlink resolution), found in x,
// ds's index (built at the first call, shared by the later ones: an open
// costs a binary search per name, not a pass over the dataset). Where some
// are not in the map, found holds the others' (to check access to them
// first: a caller learns which names are not mapped only after its access
// to the rest is checked) and the error wraps ErrInvalid, naming the first
// missing one and how many more there are; under lists the missing names
// that lie under the root, relative to it (authorizeMissing: whether the
// caller may be told that they are not in the map).
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

// authorizeMissing returns nil if c may be told that the names under
// dataset name's root (ds) that rels lists, relative to it, are not
// samples of its map: if the kernel lets c reach where each would be (an
// O_PATH open as c, which asks search permission on every folder on the
// way and none of the file). Else it returns the refusal, naming the path
// as far as c may list it, as for a mapped file c may not open: a caller
// learns which names a folder it may not search holds in the map no more
// than which it holds on disk.
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

// fileIndex is a dataset's samples sorted by path (filepath.Clean'ed):
// built once, at the first open that names files, 4 bytes a sample, and
// read by every later one. Before, each such open built a map of every
// path (at 1 281 167 samples 586 ms and 56 MB an open, asked by anyone
// who may connect).
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

// lookup returns the sample of ds at path rel (cleaned) in order (its
// fileIndex), the last in the map where it lists the path more than
// once, and whether there is one.
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
