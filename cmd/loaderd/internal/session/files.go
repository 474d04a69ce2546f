// SPDX-License-Identifier: Apache-2.0

package session

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/nvfeed/nvfeed/bmap"
)

// MaxFiles bounds an open's files: names of samples (DALI's files=).
const MaxFiles = 1 << 24

// resolveFiles returns the indices into ds.Samples of names (DALI's
// files=, in their order): each a path relative to the map's root or an
// absolute path under it, as mapped (no symlink resolution). Where some
// are not in the map, found holds the others' (to check access to them
// first: a caller learns which names are not mapped only after its access
// to the rest is checked) and the error wraps ErrInvalid, naming the first
// missing one and how many more there are.
func resolveFiles(dataset string, ds *bmap.Map, names []string) (found []int32, err error) {
	byPath := make(map[string]int32, len(ds.Samples))
	for i := range ds.Samples {
		byPath[filepath.Clean(ds.Samples[i].Path)] = int32(i)
	}
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
		i, ok := byPath[rel]
		if !ok {
			missing = append(missing, name)
			continue
		}
		idx = append(idx, i)
	}
	if len(missing) > 0 {
		more := ""
		if len(missing) > 1 {
			more = fmt.Sprintf(" (and %d more)", len(missing)-1)
		}
		return idx, fmt.Errorf("%w: files: %q%s is not a sample of dataset %s (mapped from %s): name files relative to that root, or under it, as its map lists them",
			ErrInvalid, missing[0], more, dataset, ds.Root)
	}
	return idx, nil
}
