// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"encoding/binary"
	"fmt"
)

// maxDepth bounds the nesting of a request's msgpack: no request nests
// more than a few levels (a state's sampling, backend_options' values).
const maxDepth = 16

// checkMsgpack walks one msgpack value in b before it is decoded and
// refuses (Decode wraps ErrMalformed) a value nested deeper than
// maxDepth, trailing bytes, and any length that the rest of b cannot
// hold: an array of n elements needs at least n bytes more, a map 2n, a
// string, binary or extension its length. The decoder allocates what a
// header says before reading the elements (msgpack v5.4.1 sizes slices
// without its 1M-element limit), so a 6-byte array32 header of 2^32-1
// elements would allocate 32 GiB and end the daemon with a fatal,
// unrecoverable out-of-memory; checked here, a body of b bytes allocates
// at most about b elements.
func checkMsgpack(b []byte) error {
	rest, err := skipValue(b, 0)
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("%d bytes after the value", len(rest))
	}
	return nil
}

// skipValue returns what follows the value at the start of b.
func skipValue(b []byte, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("nested deeper than %d", maxDepth)
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("truncated")
	}
	c, b := b[0], b[1:]
	// n: bytes of payload to skip; items: values that follow.
	var n, items uint64
	switch {
	case c <= 0x7f, c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3: // fixint, nil, bool
		return b, nil
	case c >= 0x80 && c <= 0x8f: // fixmap
		items = 2 * uint64(c&0x0f)
	case c >= 0x90 && c <= 0x9f: // fixarray
		items = uint64(c & 0x0f)
	case c >= 0xa0 && c <= 0xbf: // fixstr
		n = uint64(c & 0x1f)
	default:
		var size int // bytes of the length that follows c
		var kind byte
		switch c {
		case 0xc4, 0xd9: // bin8, str8
			size, kind = 1, 'b'
		case 0xc5, 0xda: // bin16, str16
			size, kind = 2, 'b'
		case 0xc6, 0xdb: // bin32, str32
			size, kind = 4, 'b'
		case 0xc7: // ext8
			size, kind = 1, 'e'
		case 0xc8: // ext16
			size, kind = 2, 'e'
		case 0xc9: // ext32
			size, kind = 4, 'e'
		case 0xcc, 0xd0: // uint8, int8
			n = 1
		case 0xcd, 0xd1: // uint16, int16
			n = 2
		case 0xca, 0xce, 0xd2: // float32, uint32, int32
			n = 4
		case 0xcb, 0xcf, 0xd3: // float64, uint64, int64
			n = 8
		case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16
			n = 1 + 1<<(c-0xd4)
		case 0xdc: // array16
			size, kind = 2, 'a'
		case 0xdd: // array32
			size, kind = 4, 'a'
		case 0xde: // map16
			size, kind = 2, 'm'
		case 0xdf: // map32
			size, kind = 4, 'm'
		default: // 0xc1: never used
			return nil, fmt.Errorf("byte 0x%02x is no msgpack type", c)
		}
		if size > 0 {
			if len(b) < size {
				return nil, fmt.Errorf("truncated length")
			}
			var l uint64
			switch size {
			case 1:
				l = uint64(b[0])
			case 2:
				l = uint64(binary.BigEndian.Uint16(b))
			case 4:
				l = uint64(binary.BigEndian.Uint32(b))
			}
			b = b[size:]
			switch kind {
			case 'b':
				n = l
			case 'e':
				n = 1 + l // the type byte, then the data
			case 'a':
				items = l
			case 'm':
				items = 2 * l
			}
		}
	}
	if n > uint64(len(b)) || items > uint64(len(b)) {
		return nil, fmt.Errorf("a length of %d says more than the %d bytes left", max(n, items), len(b))
	}
	b = b[n:]
	for ; items > 0; items-- {
		var err error
		if b, err = skipValue(b, depth+1); err != nil {
			return nil, err
		}
	}
	return b, nil
}
