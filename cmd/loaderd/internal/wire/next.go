// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"encoding/binary"
	"math"
)

// AppendNextFrame appends r as a stream frame, byte for byte as AppendFrame would.
// It writes directly: reflection was most of the cost of sending a batch.
func AppendNextFrame(dst []byte, r *NextResponse) []byte {
	at := len(dst)
	dst = append(dst, 0, 0, 0, 0) // the length, set below
	n := 9                        // the fields without omitempty
	for _, set := range [...]bool{len(r.Failed) > 0, len(r.Errors) > 0, r.DType != "", len(r.Shapes) > 0,
		r.Error != "", r.ErrorStatus != 0, r.ErrorCode != "", r.Stopped} {
		if set {
			n++
		}
	}
	dst = appendMapLen(dst, n)
	dst = appendBool(appendStr(dst, "end_of_epoch"), r.EndOfEpoch)
	dst = appendInt(appendStr(dst, "epoch"), r.Epoch)
	dst = appendInt(appendStr(dst, "iteration"), r.Iteration)
	dst = appendInt(appendStr(dst, "epoch_batches"), r.EpochBatches)
	dst = appendInt(appendStr(dst, "slot"), r.Slot)
	dst = appendInt64s(appendStr(dst, "offsets"), r.Offsets)
	dst = appendInt64s(appendStr(dst, "lengths"), r.Lengths)
	dst = appendInt32s(appendStr(dst, "labels"), r.Labels)
	dst = appendInt32s(appendStr(dst, "indices"), r.Indices)
	if len(r.Failed) > 0 {
		dst = appendArrayLen(appendStr(dst, "failed"), len(r.Failed))
		for _, v := range r.Failed {
			dst = appendInt(dst, v)
		}
	}
	if len(r.Errors) > 0 {
		dst = appendArrayLen(appendStr(dst, "errors"), len(r.Errors))
		for _, v := range r.Errors {
			dst = appendStr(dst, v)
		}
	}
	if r.DType != "" {
		dst = appendStr(appendStr(dst, "dtype"), r.DType)
	}
	if len(r.Shapes) > 0 {
		dst = appendArrayLen(appendStr(dst, "shapes"), len(r.Shapes))
		for _, s := range r.Shapes {
			dst = appendInt64s(dst, s)
		}
	}
	if r.Error != "" {
		dst = appendStr(appendStr(dst, "error"), r.Error)
	}
	if r.ErrorStatus != 0 {
		dst = appendInt(appendStr(dst, "error_status"), r.ErrorStatus)
	}
	if r.ErrorCode != "" {
		dst = appendStr(appendStr(dst, "error_code"), r.ErrorCode)
	}
	if r.Stopped {
		dst = appendBool(appendStr(dst, "stopped"), true)
	}
	binary.BigEndian.PutUint32(dst[at:], uint32(len(dst)-at-4))
	return dst
}

// The msgpack forms the reflective encoder writes for these Go types.

func appendMapLen(b []byte, n int) []byte { return appendLen(b, n, 0x80, 0xde) }

func appendArrayLen(b []byte, n int) []byte { return appendLen(b, n, 0x90, 0xdc) }

// appendLen writes a map or array header: fix|n, or code with 16 or 32 bits.
func appendLen(b []byte, n int, fix, code byte) []byte {
	switch {
	case n < 16:
		return append(b, fix|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, code), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, code+1), uint32(n))
}

func appendStr(b []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n < 256:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 0xc3)
	}
	return append(b, 0xc2)
}

// appendInt writes a Go int as msgpack's EncodeInt does: in the fewest
// bytes.
func appendInt(b []byte, v int) []byte {
	n := int64(v)
	switch {
	case n >= 0 && n <= math.MaxInt8:
		return append(b, byte(n))
	case n >= 0 && n <= math.MaxUint8:
		return append(b, 0xcc, byte(n))
	case n >= 0 && n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(n))
	case n >= 0 && n <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(n))
	case n >= 0:
		return binary.BigEndian.AppendUint64(append(b, 0xcf), uint64(n))
	case n >= -32:
		return append(b, byte(n))
	case n >= math.MinInt8:
		return append(b, 0xd0, byte(n))
	case n >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(n))
	case n >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(n))
	}
	return appendInt64(b, n)
}

// appendInt64 writes an int64 as msgpack's reflection does: 9 bytes.
func appendInt64(b []byte, v int64) []byte {
	return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(v))
}

// appendInt64s writes a []int64: nil as nil, else an array.
func appendInt64s(b []byte, vs []int64) []byte {
	if vs == nil {
		return append(b, 0xc0)
	}
	b = appendArrayLen(b, len(vs))
	for _, v := range vs {
		b = appendInt64(b, v)
	}
	return b
}

// appendInt32s writes a []int32: nil as nil, else an array of int32s
// (5 bytes each).
func appendInt32s(b []byte, vs []int32) []byte {
	if vs == nil {
		return append(b, 0xc0)
	}
	b = appendArrayLen(b, len(vs))
	for _, v := range vs {
		b = binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(v))
	}
	return b
}
