package bmap

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
)

// DefaultFilters are DALI fn.readers.file's default file_filters.
var DefaultFilters = []string{
	"*.jpg", "*.jpeg", "*.png", "*.bmp", "*.tif", "*.tiff", "*.pnm", "*.ppm",
	"*.pgm", "*.pbm", "*.jp2", "*.webp", "*.flac", "*.ogg", "*.wav",
}

// DiscoverOptions selects files the way fn.readers.file's file_filters and
// case_sensitive_filter do.
type DiscoverOptions struct {
	Filters       []string // glob patterns; nil means DefaultFilters
	CaseSensitive bool     // DALI's default is case-insensitive
}

// Entry is one discovered sample.
type Entry struct {
	Path  string // "class/file", relative to the root
	Label int32  // index of the class
}

// Discover lists samples exactly as DALI's fn.readers.file(file_root=root)
// does: the immediate subdirectories of root (stat follows links) sorted
// bytewise give the classes and labels, an empty class keeps its label;
// inside each, regular files and symlinks (never directories, no recursion)
// whose names match a filter, sorted bytewise. Files directly in root are
// skipped. Like DALI, an entry of root that cannot be stat'ed is an error.
func Discover(root string, o DiscoverOptions) (classes []string, entries []Entry, err error) {
	filters := o.Filters
	if filters == nil {
		filters = DefaultFilters
	}
	for _, f := range filters {
		if _, err := path.Match(f, ""); err != nil {
			return nil, nil, fmt.Errorf("bmap: filter %q: %w", f, err)
		}
	}
	if !o.CaseSensitive {
		lower := make([]string, len(filters))
		for i, f := range filters {
			lower[i] = asciiLower(f)
		}
		filters = lower
	}
	top, err := os.ReadDir(root) // sorted bytewise by name
	if err != nil {
		return nil, nil, fmt.Errorf("bmap: %w", err)
	}
	for _, de := range top {
		fi, err := os.Stat(filepath.Join(root, de.Name()))
		if err != nil {
			return nil, nil, fmt.Errorf("bmap: could not access %s during directory traversal: %w", filepath.Join(root, de.Name()), err)
		}
		if fi.IsDir() {
			classes = append(classes, de.Name())
		}
	}
	for label, cls := range classes {
		des, err := os.ReadDir(filepath.Join(root, cls))
		if err != nil {
			return nil, nil, fmt.Errorf("bmap: class %d: %w", label, err)
		}
		for _, de := range des {
			if t := de.Type(); !t.IsRegular() && t&fs.ModeSymlink == 0 {
				continue
			}
			if matchAny(filters, de.Name(), o.CaseSensitive) {
				entries = append(entries, Entry{Path: cls + "/" + de.Name(), Label: int32(label)})
			}
		}
	}
	return classes, entries, nil
}

func matchAny(filters []string, name string, caseSensitive bool) bool {
	if !caseSensitive {
		name = asciiLower(name)
	}
	for _, f := range filters {
		if ok, _ := path.Match(f, name); ok {
			return true
		}
	}
	return false
}

// asciiLower folds ASCII letters only, as fnmatch's FNM_CASEFOLD does in the
// C locale DALI runs in.
func asciiLower(s string) string {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
