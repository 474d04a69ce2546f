// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Format names a map file format.
type Format string

// Formats.
const (
	FormatBinary Format = "bmap"       // the native checksummed binary format
	FormatJSON   Format = "json"       // the JSON format
	FormatXNVMe  Format = "xnvme-json" // the xNVMe DALI example's format
)

// ParseFormat checks a format name.
func ParseFormat(s string) (Format, error) {
	switch f := Format(s); f {
	case FormatBinary, FormatJSON, FormatXNVMe:
		return f, nil
	}
	return "", fmt.Errorf("unknown format %q (want bmap, json or xnvme-json)", s)
}

// Encode writes m to w in format f. For FormatXNVMe it returns how many
// samples the format could not hold.
func Encode(w io.Writer, m *Map, f Format) (left int, err error) {
	switch f {
	case FormatBinary:
		return 0, WriteBinary(w, m)
	case FormatJSON:
		return 0, WriteJSON(w, m)
	case FormatXNVMe:
		return WriteXNVMe(w, m)
	}
	return 0, fmt.Errorf("bmap: unknown format %q", f)
}

// WriteFile writes m to path in format f atomically: into a temporary file
// in the same directory, synced, then renamed over path. On error path is
// left as it was.
func WriteFile(path string, m *Map, f Format) (left int, err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return 0, fmt.Errorf("bmap: %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	left, err = Encode(tmp, m, f)
	if err != nil {
		return 0, fmt.Errorf("bmap: %s: %w", path, err)
	}
	if err = tmp.Chmod(0o644); err == nil {
		if err = tmp.Sync(); err == nil {
			err = tmp.Close()
		}
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return 0, fmt.Errorf("bmap: %s: %w", path, err)
	}
	return left, nil
}

// Decode decodes a map in the binary or JSON format, detected from its
// first bytes.
func Decode(b []byte) (*Map, error) {
	if IsBinary(b) {
		return DecodeBinary(b)
	}
	t := bytes.TrimLeft(b, " \t\r\n")
	if len(t) > 0 && t[0] == '{' {
		if !bytes.Contains(t[:min(len(t), 4096)], []byte(`"version"`)) && bytes.Contains(t, []byte(`"startblock"`)) {
			return nil, ErrXNVMe
		}
		return DecodeJSON(b)
	}
	return nil, fmt.Errorf("%w: neither .bmap nor JSON", ErrCorrupt)
}

// Load reads and decodes the map file at path. A version 3 map
// (ErrWebDataset) is refused from its header, without reading the rest.
func Load(path string) (*Map, error) {
	if f, err := os.Open(path); err == nil {
		var h [12]byte
		n, _ := io.ReadFull(f, h[:])
		f.Close()
		if n == len(h) && IsBinary(h[:]) && binary.LittleEndian.Uint32(h[8:]) == versionWebDataset {
			return nil, fmt.Errorf("bmap: %s: %w", path, ErrWebDataset)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bmap: %w", err)
	}
	m, err := Decode(b)
	if err != nil {
		return nil, fmt.Errorf("bmap: %s: %w", path, err)
	}
	return m, nil
}
