// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrFileList is returned (wrapped) for a file list DALI would refuse, or
// whose paths cannot be a dataset's: the message names the line.
var ErrFileList = errors.New("bad file list")

// maxListLine is the longest line DALI's readers take from a file list:
// they read lines into a 16 KiB buffer with std::istream::getline, which
// fails on a longer one ("Wrong format of file_list").
const maxListLine = 16<<10 - 1

// ParseFileList parses a file list as fn.readers.file(file_list=) does.
// Each line is parsed from its end: C whitespace, a decimal label, whitespace, then the path verbatim.
// Blank lines are skipped; order is kept and nothing is deduplicated.
// A line without path and label is an error, and so, beyond DALI, are labels past 2^31-1 and NULs.
// An empty list gives an empty slice, not nil.
func ParseFileList(r io.Reader) ([]Entry, error) {
	entries := []Entry{}
	err := listLines(r, func(n int, line []byte) error {
		i := len(line) - 1
		for i >= 0 && isSpace(line[i]) {
			i--
		}
		if i < 0 {
			return nil // empty line
		}
		labelEnd := i + 1
		for i >= 0 && '0' <= line[i] && line[i] <= '9' {
			i--
		}
		labelStart := i + 1
		for i >= 0 && isSpace(line[i]) {
			i--
		}
		nameEnd := i + 1
		if !(nameEnd > 0 && nameEnd < labelStart && labelStart >= 2 && labelEnd > labelStart) {
			return fmt.Errorf("%w: line %d: expected a file name followed by a label; got %q", ErrFileList, n, line)
		}
		label, err := strconv.ParseInt(string(line[labelStart:labelEnd]), 10, 64)
		if err != nil || label > math.MaxInt32 {
			return fmt.Errorf("%w: line %d: label %s does not fit a 32-bit int (DALI would wrap it)", ErrFileList, n, line[labelStart:labelEnd])
		}
		entries = append(entries, Entry{Path: string(line[:nameEnd]), Label: int32(label), Line: n})
		return nil
	})
	return entries, err
}

// ParseNumpyFileList parses a file list as fn.readers.numpy(file_list=) does.
// Every non-empty line is a path, verbatim and in order; an empty list gives an empty slice.
func ParseNumpyFileList(r io.Reader) ([]Entry, error) {
	entries := []Entry{}
	err := listLines(r, func(n int, line []byte) error {
		if len(line) > 0 {
			entries = append(entries, Entry{Path: string(line), Line: n})
		}
		return nil
	})
	return entries, err
}

// listLines calls fn with each line of r (numbered from 1, without its
// '\n'; the last one may lack it), refusing lines DALI cannot read.
func listLines(r io.Reader, fn func(n int, line []byte) error) error {
	br := bufio.NewReaderSize(r, maxListLine+1) // a longest line and its '\n'

	for n := 1; ; n++ {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			return fmt.Errorf("%w: line %d is over %d bytes, DALI's limit", ErrFileList, n, maxListLine)
		}
		if err != nil && err != io.EOF {
			return fmt.Errorf("bmap: file list: %w", err)
		}
		if len(line) == 0 && err == io.EOF {
			return nil
		}
		line = bytes.TrimSuffix(line, []byte{'\n'})
		if len(line) > maxListLine {
			return fmt.Errorf("%w: line %d is %d bytes, over DALI's limit of %d", ErrFileList, n, len(line), maxListLine)
		}
		if bytes.IndexByte(line, 0) >= 0 {
			return fmt.Errorf("%w: line %d holds a NUL byte", ErrFileList, n)
		}
		if ferr := fn(n, line); ferr != nil {
			return ferr
		}
		if err == io.EOF {
			return nil
		}
	}
}

// isSpace is C's isspace in the C locale.
func isSpace(c byte) bool { return c == ' ' || '\t' <= c && c <= '\r' }

// ListedPath returns listed path p relative to root and clean.
// A path leading out of root, naming root or a directory, or with a misleading ".." is an error.
func ListedPath(root, p string) (string, error) {
	switch {
	case p == "":
		return "", errors.New("empty path")
	case strings.ContainsRune(p, 0):
		return "", errors.New("NUL byte in path")
	case strings.HasSuffix(p, "/"):
		return "", errors.New("path names a directory")
	}
	full := p
	rel := p
	if path.IsAbs(p) {
		r, err := filepath.Rel(root, p)
		if err != nil || !filepath.IsLocal(r) {
			return "", fmt.Errorf("outside the dataset root %s", root)
		}
		rel = r
	} else {
		full = root + "/" + p // as DALI joins them: the kernel resolves any ".."
	}
	c := path.Clean(rel)
	if c == "." || !filepath.IsLocal(c) {
		return "", fmt.Errorf("leads out of the dataset root %s", root)
	}
	if hasDotDot(p) {
		var a, b unix.Stat_t
		if err := unix.Stat(full, &a); err != nil {
			return "", &os.PathError{Op: "stat", Path: full, Err: err}
		}
		if err := unix.Stat(filepath.Join(root, c), &b); err != nil || a.Dev != b.Dev || a.Ino != b.Ino {
			return "", fmt.Errorf("its \"..\" names another file than %s (a symlinked directory?): write the path without \"..\"", c)
		}
	}
	return c, nil
}

// hasDotDot reports whether p has a ".." component.
func hasDotDot(p string) bool {
	for _, e := range strings.Split(p, "/") {
		if e == ".." {
			return true
		}
	}
	return false
}
