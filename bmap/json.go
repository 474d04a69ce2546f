// SPDX-License-Identifier: Apache-2.0

package bmap

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/nvfeed/nvfeed/bmap/npy"
	"github.com/nvfeed/nvfeed/extentinfo"
)

// The JSON format, read by other tools. Its shape is fixed:
//
//	{"version": 1, "root": "/abs/root",
//	 "device": {"path", "major", "minor", "disk", "partition_start",
//	            "logical_block_size", "fs_type", "fs_uuid"},
//	 "reader", "listed",
//	 "discovery": {"filters", "case_sensitive", "file_filter"},
//	 "classes": [...],
//	 "samples": [{"path", "label", "size", "raw", "reason",
//	              "extents": [{"logical", "physical", "length", "flags"}],
//	              "inode", "mtime_ns", "ctime_ns",
//	              "offset", "dtype", "shape"}]}
//
// inode, mtime_ns and ctime_ns keep the freshness check possible after a JSON round trip.
// Version 2 adds reader, listed, discovery, and a tensor's offset, dtype and shape.
type jsonMap struct {
	Version int        `json:"version"`
	Root    string     `json:"root"`
	Device  jsonDevice `json:"device"`
	Reader  string     `json:"reader,omitempty"`
	Listed  bool       `json:"listed,omitempty"`
	// Discovery is Map.Discovery; absent: DALI's defaults.
	Discovery *jsonDiscovery `json:"discovery,omitempty"`
	Classes   []string       `json:"classes"`
	Samples   []jsonSample   `json:"samples"`
}

type jsonDiscovery struct {
	Filters       []string `json:"filters,omitempty"`
	CaseSensitive bool     `json:"case_sensitive,omitempty"`
	FileFilter    string   `json:"file_filter,omitempty"`
}

type jsonDevice struct {
	Path             string `json:"path"`
	Major            uint32 `json:"major"`
	Minor            uint32 `json:"minor"`
	Disk             string `json:"disk"`
	PartitionStart   uint64 `json:"partition_start"`
	LogicalBlockSize uint32 `json:"logical_block_size"`
	FSType           string `json:"fs_type"`
	FSUUID           string `json:"fs_uuid"`
}

type jsonSample struct {
	Path    string       `json:"path"`
	Label   int32        `json:"label"`
	Size    int64        `json:"size"`
	Raw     bool         `json:"raw"`
	Reason  string       `json:"reason"`
	Extents []jsonExtent `json:"extents"`
	Inode   uint64       `json:"inode"`
	MtimeNs int64        `json:"mtime_ns"`
	CtimeNs int64        `json:"ctime_ns"`
	Offset  int64        `json:"offset,omitempty"`
	DType   string       `json:"dtype,omitempty"`
	Shape   []int64      `json:"shape,omitempty"`
}

type jsonExtent struct {
	Logical  uint64 `json:"logical"`
	Physical uint64 `json:"physical"`
	Length   uint64 `json:"length"`
	Flags    uint32 `json:"flags"`
}

// WriteJSON writes m in the JSON format.
func WriteJSON(w io.Writer, m *Map) error {
	d := m.Device
	jm := jsonMap{Version: m.Version, Root: m.Root, Classes: m.Classes,
		Device:  jsonDevice{d.Path, d.Major, d.Minor, d.Disk, d.PartitionStart, d.LogicalBlockSize, d.FSType, d.FSUUID},
		Samples: make([]jsonSample, len(m.Samples))}
	if jm.Classes == nil {
		jm.Classes = []string{}
	}
	if m.Version != 1 {
		jm.Reader, jm.Listed = m.Reader.String(), m.Listed
		if o := m.Discovery; o != nil {
			jm.Discovery = &jsonDiscovery{Filters: o.Filters, CaseSensitive: o.CaseSensitive, FileFilter: o.FileFilter}
		}
	}
	for i := range m.Samples {
		s := &m.Samples[i]
		js := jsonSample{Path: s.Path, Label: s.Label, Size: s.Size, Raw: s.Reason == Raw, Reason: s.Reason.String(),
			Extents: make([]jsonExtent, len(s.Extents)), Inode: s.Inode, MtimeNs: s.MtimeNs, CtimeNs: s.CtimeNs, Offset: s.Offset}
		if t := s.Tensor; t != nil {
			js.DType, js.Shape = t.DType.String(), t.Shape
		}
		for j, e := range s.Extents {
			js.Extents[j] = jsonExtent(e)
		}
		jm.Samples[i] = js
	}
	enc := json.NewEncoder(w)
	if err := enc.Encode(&jm); err != nil {
		return fmt.Errorf("bmap: write json: %w", err)
	}
	return nil
}

// DecodeJSON decodes the JSON format and validates the result.
func DecodeJSON(b []byte) (*Map, error) {
	var jm jsonMap
	if err := json.Unmarshal(b, &jm); err != nil {
		return nil, fmt.Errorf("%w: json: %v", ErrCorrupt, err)
	}
	d := jm.Device
	m := &Map{Version: jm.Version, Root: jm.Root, Listed: jm.Listed,
		Device: extentinfo.Device{Path: d.Path, Major: d.Major, Minor: d.Minor, Disk: d.Disk, PartitionStart: d.PartitionStart, LogicalBlockSize: d.LogicalBlockSize, FSType: d.FSType, FSUUID: d.FSUUID}}
	if jm.Reader != "" {
		r, err := ParseReader(jm.Reader)
		if err != nil {
			return nil, fmt.Errorf("%w: reader: %v", ErrCorrupt, err)
		}
		m.Reader = r
	}
	if o := jm.Discovery; o != nil {
		m.Discovery = &DiscoverOptions{Filters: o.Filters, CaseSensitive: o.CaseSensitive, FileFilter: o.FileFilter}
	}
	if len(jm.Classes) > 0 {
		m.Classes = jm.Classes
	}
	if len(jm.Samples) > 0 {
		m.Samples = make([]Sample, len(jm.Samples))
	}
	for i, js := range jm.Samples {
		r, err := ParseReason(js.Reason)
		if err != nil {
			return nil, fmt.Errorf("%w: samples[%d] (%q): reason: %v", ErrCorrupt, i, js.Path, err)
		}
		if js.Raw != (r == Raw) {
			return nil, fmt.Errorf("%w: samples[%d] (%q): raw=%v contradicts reason %q", ErrCorrupt, i, js.Path, js.Raw, js.Reason)
		}
		s := Sample{Path: js.Path, Label: js.Label, Size: js.Size, Offset: js.Offset, Inode: js.Inode, MtimeNs: js.MtimeNs, CtimeNs: js.CtimeNs, Reason: r}
		if js.DType != "" {
			dt, err := npy.ParseDType(js.DType)
			if err != nil {
				return nil, fmt.Errorf("%w: samples[%d] (%q): %v", ErrCorrupt, i, js.Path, err)
			}
			s.Tensor = &Tensor{DType: dt}
			if len(js.Shape) > 0 {
				s.Tensor.Shape = js.Shape
			}
		} else if len(js.Shape) > 0 {
			return nil, fmt.Errorf("%w: samples[%d] (%q): a shape without a dtype", ErrCorrupt, i, js.Path)
		}
		if len(js.Extents) > 0 {
			s.Extents = make([]extentinfo.Extent, len(js.Extents))
			for j, e := range js.Extents {
				s.Extents[j] = extentinfo.Extent(e)
			}
		}
		m.Samples[i] = s
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}
