// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// ErrLayout is returned (wrapped) by Build for a root without a sample in
// DALI fn.readers.file's layout, ROOT/CLASS/FILE: no class folder, or no
// file in them that the filters match. The message says what it found.
var ErrLayout = errors.New("no samples in fn.readers.file's layout ROOT/CLASS/FILE (one folder per class, the files in it)")

// DefaultFilters are DALI fn.readers.file's default file_filters.
var DefaultFilters = []string{
	"*.jpg", "*.jpeg", "*.png", "*.bmp", "*.tif", "*.tiff", "*.pnm", "*.ppm",
	"*.pgm", "*.pbm", "*.jp2", "*.webp", "*.flac", "*.ogg", "*.wav",
}

// DefaultNumpyFilter is DALI fn.readers.numpy's default file_filter.
const DefaultNumpyFilter = "*.npy"

// DiscoverOptions selects files the way fn.readers.file's file_filters and
// case_sensitive_filter, and fn.readers.numpy's file_filter, do.
type DiscoverOptions struct {
	Filters       []string // fn.readers.file: glob patterns; nil means DefaultFilters
	CaseSensitive bool     // fn.readers.file: DALI's default is case-insensitive
	FileFilter    string   // fn.readers.numpy: one glob, always case-sensitive; "" means DefaultNumpyFilter
}

// Entry is one sample, discovered or listed.
type Entry struct {
	Path  string // relative to the root: "class/file" in a folder layout
	Label int32  // the class index in a folder layout; the listed label
	Line  int    // the line of the list it comes from (1-based); 0 when not from a file list
}

// Discover lists samples exactly as fn.readers.file(file_root=root) does.
// Subdirectories of root, sorted bytewise, are the classes; an empty one keeps its label.
// Each class's matching files and symlinks come sorted, without recursion.
// Files in root are skipped; an entry that cannot be stat'ed is an error.
func Discover(root string, o DiscoverOptions) (classes []string, entries []Entry, err error) {
	filters, err := fileFilters(o)
	if err != nil {
		return nil, nil, err
	}
	if classes, err = classFolders(root); err != nil {
		return nil, nil, err
	}
	for label, cls := range classes {
		if err := classFiles(root, cls, filters, o.CaseSensitive, func(name string) {
			entries = append(entries, Entry{Path: cls + "/" + name, Label: int32(label)})
		}); err != nil {
			return nil, nil, fmt.Errorf("bmap: class %d: %w", label, err)
		}
	}
	return classes, entries, nil
}

// fileFilters returns o's fn.readers.file filters as matchAny takes them.
func fileFilters(o DiscoverOptions) ([]string, error) {
	filters := o.Filters
	if filters == nil {
		filters = DefaultFilters
	}
	filters, err := globs(filters)
	if err != nil {
		return nil, err
	}
	if !o.CaseSensitive {
		lower := make([]string, len(filters))
		for i, f := range filters {
			lower[i] = asciiLower(f)
		}
		filters = lower
	}
	return filters, nil
}

// classFolders returns the immediate subdirectories of root (stat
// follows links), sorted bytewise: fn.readers.file's classes.
func classFolders(root string) ([]string, error) {
	top, err := os.ReadDir(root) // sorted bytewise by name
	if err != nil {
		return nil, fmt.Errorf("bmap: %w", err)
	}
	var classes []string
	for _, de := range top {
		fi, err := os.Stat(filepath.Join(root, de.Name()))
		if err != nil {
			return nil, fmt.Errorf("bmap: could not access %s during directory traversal: %w", filepath.Join(root, de.Name()), err)
		}
		if fi.IsDir() {
			classes = append(classes, de.Name())
		}
	}
	return classes, nil
}

// classFiles calls fn, in bytewise order, with the name of each regular
// file or symlink in class folder cls under root that a filter matches.
func classFiles(root, cls string, filters []string, caseSensitive bool, fn func(name string)) error {
	des, err := os.ReadDir(filepath.Join(root, cls))
	if err != nil {
		return err
	}
	for _, de := range des {
		if t := de.Type(); !t.IsRegular() && t&fs.ModeSymlink == 0 {
			continue
		}
		if matchAny(filters, de.Name(), caseSensitive) {
			fn(de.Name())
		}
	}
	return nil
}

// DiscoverNumpy lists samples exactly as fn.readers.numpy(file_root=root, file_filter=filter) does.
// Files in root come first, then each subdirectory's, sorted bytewise, no deeper.
// The match is case-sensitive fnmatch, hidden files included; "" means DefaultNumpyFilter.
// An entry of root that cannot be stat'ed is an error. Labels are 0.
func DiscoverNumpy(root, filter string) ([]Entry, error) {
	entries, _, err := discoverNumpy(root, filter)
	return entries, err
}

// discoverNumpy is DiscoverNumpy, with the subdirectories of root it
// listed.
func discoverNumpy(root, filter string) ([]Entry, []string, error) {
	if filter == "" {
		filter = DefaultNumpyFilter
	}
	f, err := globs([]string{filter})
	if err != nil {
		return nil, nil, err
	}
	top, err := os.ReadDir(root) // sorted bytewise by name
	if err != nil {
		return nil, nil, fmt.Errorf("bmap: %w", err)
	}
	var dirs []string
	for _, de := range top {
		fi, err := os.Stat(filepath.Join(root, de.Name()))
		if err != nil {
			return nil, nil, fmt.Errorf("bmap: could not access %s during directory traversal: %w", filepath.Join(root, de.Name()), err)
		}
		if fi.IsDir() {
			dirs = append(dirs, de.Name())
		}
	}
	entries := numpyFiles(nil, top, "", f)
	for _, d := range dirs {
		des, err := os.ReadDir(filepath.Join(root, d))
		if err != nil {
			return nil, nil, fmt.Errorf("bmap: %w", err)
		}
		entries = numpyFiles(entries, des, d+"/", f)
	}
	return entries, dirs, nil
}

// numpyFiles appends the regular files and symlinks of des matching
// filter, in order, with prefix.
func numpyFiles(entries []Entry, des []os.DirEntry, prefix string, filter []string) []Entry {
	for _, de := range des {
		if t := de.Type(); !t.IsRegular() && t&fs.ModeSymlink == 0 {
			continue
		}
		if matchAny(filter, de.Name(), true) {
			entries = append(entries, Entry{Path: prefix + de.Name()})
		}
	}
	return entries
}

// globs turns fnmatch patterns (what DALI's filters are) into
// path.Match's: fnmatch's bracket negation "[!" becomes "[^". A pattern
// path.Match cannot take, or with a POSIX character class ("[:alpha:]"),
// which path.Match would read differently, is an error.
func globs(patterns []string) ([]string, error) {
	out := make([]string, len(patterns))
	for i, p := range patterns {
		var b strings.Builder
		inClass := false
		for j := 0; j < len(p); j++ {
			c := p[j]
			switch {
			case c == '\\' && j+1 < len(p):
				b.WriteByte(c)
				j++
				c = p[j]
			case !inClass && c == '[':
				inClass = true
				b.WriteByte(c)
				if j+1 < len(p) && p[j+1] == '!' {
					b.WriteByte('^')
					j++
				}
				continue
			case inClass && c == '[' && j+1 < len(p) && p[j+1] == ':':
				return nil, fmt.Errorf("bmap: filter %q: POSIX character classes ([:name:]) are not supported", p)
			case inClass && c == ']':
				inClass = false
			}
			b.WriteByte(c)
		}
		out[i] = b.String()
		if _, err := path.Match(out[i], ""); err != nil {
			return nil, fmt.Errorf("bmap: filter %q: %w", p, err)
		}
	}
	return out, nil
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

// layoutError describes why root (whose class folders Discover found)
// holds no sample: what is in root and in its class folders.
func layoutError(root string, classes []string, o DiscoverOptions) error {
	filters := o.Filters
	if filters == nil {
		filters = DefaultFilters
	}
	globbed, _ := globs(filters) // Discover checked them
	var files, matching []string
	top, _ := os.ReadDir(root)
	for _, de := range top {
		if fi, err := os.Stat(filepath.Join(root, de.Name())); err == nil && fi.Mode().IsRegular() {
			files = append(files, de.Name())
			if matchAny(lowerIf(globbed, !o.CaseSensitive), de.Name(), o.CaseSensitive) {
				matching = append(matching, de.Name())
			}
		}
	}
	var found string
	switch {
	case len(classes) == 0 && len(files) == 0:
		found = "nothing: no class folder, no file"
	case len(classes) == 0:
		found = fmt.Sprintf("no class folder, and %s directly in %s (%s), %d matching the filters: "+
			"DALI skips files in the root, so move them into one folder per class, e.g. %s",
			plural(len(files), "file"), root, examples(files), len(matching), filepath.Join(root, "CLASS", firstOr(matching, files)))
	default:
		found = fmt.Sprintf("%s (%s) but no file in them matches the filters %s", plural(len(classes), "class folder"), examples(classes),
			strings.Join(filters, " "))
		if o.Filters == nil {
			found += " (--filter replaces them)"
		}
		if len(matching) > 0 {
			found += fmt.Sprintf("; %s matching the filters directly in the root (%s), where DALI skips them", plural(len(matching), "file"), examples(matching))
		}
	}
	return fmt.Errorf("bmap: %s: %w; found %s", root, ErrLayout, found)
}

func lowerIf(filters []string, lower bool) []string {
	if !lower {
		return filters
	}
	out := make([]string, len(filters))
	for i, f := range filters {
		out[i] = asciiLower(f)
	}
	return out
}

// examples lists up to three names, and how many more there are.
func examples(names []string) string {
	if len(names) <= 3 {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s, … %d more", strings.Join(names[:3], ", "), len(names)-3)
}

func firstOr(a, b []string) string {
	if len(a) > 0 {
		return a[0]
	}
	return b[0]
}

// Unmapped returns how many files Discover(m.Root, o) lists now that the map lacks.
// They were added since mapping and are not served. A listed map has none.
func (m *Map) Unmapped(o DiscoverOptions) (int, error) {
	n, _, err := m.UnmappedIn(o)
	return n, err
}

// UnmappedIn is Unmapped, with the folders it listed to count: the root
// first, then each of its immediate subdirectories (as the listing
// reached them, through symlinks). A map from a file list lists none.
func (m *Map) UnmappedIn(o DiscoverOptions) (n int, dirs []string, err error) {
	var entries []Entry
	var sub []string
	switch {
	case m.Listed:
		return 0, nil, nil
	case m.Reader == ReaderNumpy:
		entries, sub, err = discoverNumpy(m.Root, o.FileFilter)
	default:
		sub, entries, err = Discover(m.Root, o)
	}
	if err != nil {
		return 0, nil, err
	}
	dirs = make([]string, 0, len(sub)+1)
	dirs = append(dirs, m.Root)
	for _, d := range sub {
		dirs = append(dirs, filepath.Join(m.Root, d))
	}
	return m.countUnmapped(entries), dirs, nil
}

// ClassCounts counts, by class folder, the files a map of
// fn.readers.file's folder layout lacks there (UnmappedInClasses).
type ClassCounts map[string]int

// UnmappedInClasses is UnmappedIn for a folder-layout map, one class folder at a time.
// The root is listed again; a class folder only where relist says so or kept lacks it.
// It returns the counts, their sum, and the folders listed.
func (m *Map) UnmappedInClasses(o DiscoverOptions, kept ClassCounts, relist func(class string) bool, mapped func(path string) bool) (ClassCounts, int, []string, error) {
	if m.Listed || m.Reader == ReaderNumpy {
		return nil, 0, nil, fmt.Errorf("bmap: counting by class folder: the map is not of fn.readers.file's folder layout")
	}
	filters, err := fileFilters(o)
	if err != nil {
		return nil, 0, nil, err
	}
	classes, err := classFolders(m.Root)
	if err != nil {
		return nil, 0, nil, err
	}
	counts, n := make(ClassCounts, len(classes)), 0
	dirs := append(make([]string, 0, len(classes)+1), m.Root)
	for label, cls := range classes {
		dirs = append(dirs, filepath.Join(m.Root, cls))
		k, ok := kept[cls]
		if !ok || relist(cls) {
			k = 0
			if err := classFiles(m.Root, cls, filters, o.CaseSensitive, func(name string) {
				if !mapped(cls + "/" + name) {
					k++
				}
			}); err != nil {
				return nil, 0, nil, fmt.Errorf("bmap: class %d: %w", label, err)
			}
		}
		counts[cls] = k
		n += k
	}
	return counts, n, dirs, nil
}

// countUnmapped returns how many of entries the map has no sample for.
func (m *Map) countUnmapped(entries []Entry) int {
	mapped := make([]string, len(m.Samples))
	for i := range m.Samples {
		mapped[i] = m.Samples[i].Path
	}
	slices.Sort(mapped)
	n := 0
	for _, e := range entries {
		if _, found := slices.BinarySearch(mapped, e.Path); !found {
			n++
		}
	}
	return n
}

// plural returns "1 file", "2 files".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
