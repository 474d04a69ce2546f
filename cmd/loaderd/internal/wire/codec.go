// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/vmihailenco/msgpack/v5"
)

// ErrMalformed is wrapped by every error for a message that does not
// follow the protocol: msgpack that does not parse or nests too deep, an
// unknown key, a frame too long or cut short. Its text is the session
// core's for a bad request ("invalid request"); a transport answers it
// as one (400).
var ErrMalformed = errors.New("invalid request")

// Limits on what a client sends, each sized to the largest valid message
// with room to spare: a body past its endpoint's limit is refused before
// it is read (by its Content-Length) or as soon as the limit is passed,
// so a refused body costs the daemon at most the limit, not what the
// client sent.
const (
	// MaxOpenBody bounds an open request's body: its strings are short
	// (names, a job_id of 128 bytes, a UUID) and backend_options has at
	// most 64 entries; a valid one is well under 4 KiB.
	MaxOpenBody = 64 << 10
	// MaxSmallBody bounds the other requests' bodies (next, release,
	// stream): at most two lists of 129 slots and two numbers, under
	// 1 KiB.
	MaxSmallBody = 4 << 10
	// MaxBody is the largest body any endpoint takes (MaxOpenBody).
	MaxBody = MaxOpenBody
	// MaxFrame bounds a stream control frame: two lists of 129 slots at
	// most, under 1 KiB.
	MaxFrame = 4 << 10
	// MaxString bounds every string and binary value in a message: no
	// field needs more (a job_id has 128 bytes, a device UUID 64), and a
	// long one would be quoted back in errors.
	MaxString = 4 << 10
	// MaxDecoded bounds the memory a message may make its decoder
	// materialise, as checkMsgpack estimates it (the costs in
	// msgcheck.go; a smaller message gets less: 16 KiB and twice its
	// size): a valid message needs a few KiB, while a body of small
	// values can make generic maps and slices 10–30 times its size.
	MaxDecoded = 64 << 10
)

// Decode decodes a request body into v: its msgpack checked first
// (checkMsgpack: nothing allocated past what b holds, at most MaxDecoded
// bytes materialised, no string over MaxString), unknown keys refused.
// Errors wrap ErrMalformed.
func Decode(b []byte, v any) error {
	if err := checkMsgpack(b); err != nil {
		return fmt.Errorf("%w: malformed msgpack request: %w", ErrMalformed, err)
	}
	dec := msgpack.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields(true)
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: malformed msgpack request: %w", ErrMalformed, err)
	}
	return nil
}

// DecodeControl decodes a stream control frame's msgpack (checked first;
// unknown keys are ignored, so a newer client's frames pass). Errors wrap
// ErrMalformed. The slots it names are not checked here.
func DecodeControl(b []byte) (StreamControl, error) {
	var f StreamControl
	if err := checkMsgpack(b); err != nil {
		return f, fmt.Errorf("malformed control frame: %w: %w", ErrMalformed, err)
	}
	if err := msgpack.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("malformed control frame: %w: %w", ErrMalformed, err)
	}
	return f, nil
}

// ReadFrame reads one frame's bytes into buf (grown as needed): io.EOF
// when the connection ends between frames, an error wrapping
// ErrMalformed for a frame over MaxFrame or cut short.
func ReadFrame(rd io.Reader, buf []byte) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(rd, n[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("%w: control frame length cut short", ErrMalformed)
		}
		return nil, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > MaxFrame {
		return nil, fmt.Errorf("%w: control frame of %d bytes (limit %d)", ErrMalformed, size, MaxFrame)
	}
	if uint32(cap(buf)) < size {
		buf = make([]byte, size)
	}
	buf = buf[:size]
	if _, err := io.ReadFull(rd, buf); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("%w: control frame of %d bytes cut short", ErrMalformed, size)
		}
		return nil, err
	}
	return buf, nil
}

// AppendFrame appends v as a frame to dst: a 4-byte big-endian length and
// v's msgpack.
func AppendFrame(dst []byte, v any) ([]byte, error) {
	b, err := msgpack.Marshal(v)
	if err != nil {
		return dst, err
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(b)))
	return append(dst, b...), nil
}

// MarshalJSON encodes a message as JSON with the keys its msgpack form
// has (its msgpack tags, omitempty included), indented, with a final
// newline: what the read-only endpoints answer to Accept:
// application/json, and loaderd status --json prints. v is encoded to
// msgpack and decoded into plain maps and slices first.
func MarshalJSON(v any) ([]byte, error) {
	b, err := msgpack.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("wire: %T as JSON: %w", v, err)
	}
	var plain any
	if err := msgpack.Unmarshal(b, &plain); err != nil {
		return nil, fmt.Errorf("wire: %T as JSON: %w", v, err)
	}
	out, err := json.MarshalIndent(plain, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("wire: %T as JSON: %w", v, err)
	}
	return append(out, '\n'), nil
}
