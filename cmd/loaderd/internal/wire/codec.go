// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"bytes"
	"encoding/binary"
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

// Limits on what a client sends.
const (
	MaxBody  = 1 << 20 // bytes of a request body
	MaxFrame = 1 << 20 // bytes of a stream control frame
)

// Decode decodes a request body into v: its msgpack checked first
// (checkMsgpack: nothing allocated past what b holds), unknown keys
// refused. Errors wrap ErrMalformed.
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
