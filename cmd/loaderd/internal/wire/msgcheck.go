// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// maxDepth bounds the nesting of a request's msgpack: no request nests
// more than a few levels (a state's sampling, backend_options' values).
const maxDepth = 16

// checkMsgpack walks one msgpack value in b before it is decoded.
// It refuses nesting past maxDepth, trailing bytes, and lengths the rest of b cannot hold.
// The decoder allocates what a header says first: a 6-byte header could ask for 32 GiB.
// The walk also charges each value what decoding it would materialise.
// It refuses a message past MaxDecoded and a string or binary past MaxString.
func checkMsgpack(b []byte) error {
	budget := min(int64(MaxDecoded), decodedSlack+decodedPerByte*int64(len(b)))
	rest, err := skipValue(b, 0, &budget)
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("%d bytes after the value", len(rest))
	}
	return nil
}

// What decoding materialises per value, as checkMsgpack charges it: an upper estimate.
const (
	costValue = 24 // every value: an interface slot, or a slice element and its growth
	costEntry = 96 // every map entry, besides its key and value: buckets, growth, hashing
	costBytes = 16 // every string, binary or extension, besides its bytes: header and rounding
)

// A message of n bytes may materialise decodedSlack + decodedPerByte·n bytes, at most MaxDecoded.
// A valid request's generic values fit in the slack.
const (
	decodedSlack   = 16 << 10
	decodedPerByte = 2
)

// charge takes cost from budget, or says the message would materialise
// more than MaxDecoded.
func charge(budget *int64, cost uint64) error {
	if cost > uint64(*budget) {
		return errTooBig
	}
	*budget -= int64(cost)
	return nil
}

// errTooBig says a message would materialise more than its budget.
var errTooBig = errors.New("decoding would take more memory than the message's size allows")

// skipValue returns what follows the value at the start of b, charging
// budget for what decoding it materialises.
func skipValue(b []byte, depth int, budget *int64) ([]byte, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("nested deeper than %d", maxDepth)
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("truncated")
	}
	if err := charge(budget, costValue); err != nil {
		return nil, err
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
		if err := charge(budget, costBytes+n); err != nil {
			return nil, err
		}
	default:
		var size int // bytes of the length that follows c
		var kind byte
		switch c {
		case 0xc4, 0xc5, 0xc6: // bin8, bin16, bin32
			size, kind = 1<<(c-0xc4), 'b'
		case 0xd9, 0xda, 0xdb: // str8, str16, str32
			size, kind = 1<<(c-0xd9), 'b'
		case 0xc7, 0xc8, 0xc9: // ext8, ext16, ext32
			size, kind = 1<<(c-0xc7), 'e'
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
		case 0xdc, 0xdd: // array16, array32
			size, kind = 2<<(c-0xdc), 'a'
		case 0xde, 0xdf: // map16, map32
			size, kind = 2<<(c-0xde), 'm'
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
			if kind == 'b' || kind == 'e' {
				if l > MaxString {
					return nil, fmt.Errorf("a string or binary of %d bytes, at most %d", l, MaxString)
				}
				if err := charge(budget, costBytes+l); err != nil {
					return nil, err
				}
			}
		}
	}
	if n > uint64(len(b)) || items > uint64(len(b)) {
		return nil, fmt.Errorf("a length of %d says more than the %d bytes left", max(n, items), len(b))
	}
	if c&0xf0 == 0x80 || c == 0xde || c == 0xdf { // a map: its entries
		if err := charge(budget, items/2*costEntry); err != nil {
			return nil, err
		}
	}
	b = b[n:]
	for ; items > 0; items-- {
		var err error
		if b, err = skipValue(b, depth+1, budget); err != nil {
			return nil, err
		}
	}
	return b, nil
}
