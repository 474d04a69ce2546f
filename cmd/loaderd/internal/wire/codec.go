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

// ErrMalformed is wrapped by every error for a message that breaks the protocol.
// A transport answers it 400.
var ErrMalformed = errors.New("invalid request")

// Limits on what a client sends, each the largest valid message with room to spare.
// A body past its limit is refused before or as soon as the limit is passed.
const (
	// MaxOpenBody bounds an open request's body; a valid one is under 4 KiB.
	MaxOpenBody = 64 << 10
	// MaxSmallBody bounds next, release and stream bodies.
	MaxSmallBody = 4 << 10
	// MaxBody is the largest body any endpoint takes.
	MaxBody = MaxOpenBody
	// MaxFrame bounds a stream control frame.
	MaxFrame = 4 << 10
	// MaxString bounds every string and binary value in a message.
	MaxString = 4 << 10
	// MaxDecoded bounds the memory a message may make its decoder materialise.
	MaxDecoded = 64 << 10
)

// Decode decodes a request body into v, checked first, unknown keys refused.
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

// DecodeControl decodes a stream control frame; unknown keys are ignored.
// Errors wrap ErrMalformed. The slots are not checked here.
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

// ReadFrame reads one frame into buf: io.EOF between frames, ErrMalformed if too long or cut.
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

// AppendFrame appends v as a frame: a 4-byte big-endian length and v's msgpack.
func AppendFrame(dst []byte, v any) ([]byte, error) {
	b, err := msgpack.Marshal(v)
	if err != nil {
		return dst, err
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(b)))
	return append(dst, b...), nil
}

// MarshalJSON encodes a message as indented JSON with its msgpack keys.
// The read-only endpoints and loaderd status --json use it.
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
