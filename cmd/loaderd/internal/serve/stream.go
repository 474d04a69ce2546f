// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/session"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
)

// stream upgrades the connection and pushes the session's batches to it
// (see wire.StreamRequest for the protocol).
func (s *Server) stream(w http.ResponseWriter, r *http.Request) {
	id, c := chi.URLParam(r, "id"), caller(r)
	if !strings.EqualFold(r.Header.Get("Upgrade"), wire.StreamUpgrade) {
		writeErr(w, http.StatusBadRequest, fmt.Sprintf("a stream needs the header Upgrade: %s", wire.StreamUpgrade))
		return
	}
	var req wire.StreamRequest
	at, err := decodePosition(r, &req, &req.Epoch, &req.Iteration)
	if err != nil {
		fail(w, err)
		return
	}
	if err := session.CheckStream(at, req.Keep); err != nil {
		fail(w, err)
		return
	}
	if err := s.mgr.Check(c, id); err != nil {
		fail(w, err)
		return
	}
	conn, brw, ok := switchProtocols(w, wire.StreamUpgrade)
	if !ok {
		return
	}
	defer conn.Close()
	s.deadlines(conn)
	alive := func() { // a frame went by: the stream is not idle
		if s.streamIdle > 0 {
			conn.SetReadDeadline(time.Now().Add(s.streamIdle))
		}
	}
	alive()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	type control struct {
		keep []int // the slots to keep, when the client asked to stop
		err  error // why the control side ended otherwise
	}
	ctl := make(chan control, 1)
	go func() {
		defer cancel()
		var keep []int
		var err error
		defer func() { // a bug here must not end the daemon: it ends this stream
			if r := recover(); r != nil {
				err = fmt.Errorf("reading control frames panicked: %v", r)
				s.log.Error("serve: stream control", "session", id, "err", err, "stack", string(debug.Stack()))
			}
			ctl <- control{keep, err}
		}()
		keep, err = s.readControl(c, id, brw.Reader, alive)
	}()
	out := bufio.NewWriterSize(conn, 64<<10)
	var frame []byte
	send := func(v wire.NextResponse) error {
		frame = wire.AppendNextFrame(frame[:0], &v)
		if s.writeTimeout > 0 {
			conn.SetWriteDeadline(time.Now().Add(s.writeTimeout))
		}
		out.Write(frame)
		if err := out.Flush(); err != nil {
			return err
		}
		alive()
		return nil
	}
	err = s.mgr.Stream(ctx, c, id, at, req.Keep, func(d session.Delivery) error { return send(nextResponse(d)) })
	cancel()
	var cr control
	stopped := false
	select {
	case cr = <-ctl:
		stopped = cr.err == nil
	case <-time.After(controlGrace):
		// The session ended under the client (closed, daemon stopping).
		// The grace lets a control side ending at the same moment (its
		// idle deadline, its stop) say so first: then the client is told
		// that, not nothing.
	}
	switch {
	case stopped: // the client stops: release all but what it holds, then say so
		if rerr := s.mgr.ReleaseExcept(c, id, cr.keep); rerr != nil && err == nil {
			err = rerr
		}
		if err == nil {
			send(wire.NextResponse{Stopped: true})
			return
		}
	default:
		// The client went away or broke the protocol, or the session ended.
		// What it was handed stays held: a client whose connection broke
		// may still be using those batches, and releasing them would let
		// the session's reads overwrite them. Its next stream says what it
		// still holds; a session nobody comes back to is reaped.
		switch {
		case errors.Is(cr.err, os.ErrDeadlineExceeded):
			s.log.Info("serve: stream idle, closed", "session", id, "idle", s.streamIdle)
			err = fmt.Errorf("session %s: stream closed after %s without a frame either way", id, s.streamIdle)
		case cr.err != nil && closeLevel(cr.err) != slog.LevelDebug:
			s.log.Warn("serve: stream control", "session", id, "err", cr.err)
			err = fmt.Errorf("session %s: stream control: %w", id, cr.err)
		case cr.err != nil: // the client closed its end
			s.log.Debug("serve: stream closed by the client", "session", id, "err", cr.err)
		case err == nil:
			err = s.mgr.Check(c, id) // say why it ended
		}
	}
	if err != nil {
		send(errorFrame(err))
	}
}

// controlGrace is how long a stream whose session side ended waits for
// its control side to say why it ended too, if it is ending.
const controlGrace = 100 * time.Millisecond

// readControl applies the client's release frames until a stop (returning
// the slots to keep) or the end of the connection (an error); alive is
// called after each frame. A frame the client got wrong (oversized,
// truncated, malformed, slots out of range) ends the stream with an error
// answered 400 (wrapping wire.ErrMalformed or session.ErrInvalid).
func (s *Server) readControl(c session.Caller, id string, rd *bufio.Reader, alive func()) ([]int, error) {
	buf := make([]byte, 0, 256)
	for {
		var err error
		if buf, err = wire.ReadFrame(rd, buf); err != nil {
			return nil, err
		}
		alive()
		f, err := decodeControl(buf)
		if err != nil {
			return nil, err
		}
		for _, slot := range f.Release {
			if err := s.mgr.Release(c, id, slot); err != nil { // the client's mistake, not the daemon's
				s.log.Info("serve: stream release refused", "session", id, "slot", slot, "err", err)
			}
		}
		if f.Stop {
			return f.Keep, nil
		}
	}
}

// deadlines replaces, on a connection just taken over from the HTTP
// server, the deadlines the server left for its request with a write
// deadline per frame: the stream sets its read deadline itself.
func (s *Server) deadlines(conn net.Conn) {
	conn.SetDeadline(time.Time{})
	if s.writeTimeout > 0 {
		conn.SetWriteDeadline(time.Now().Add(s.writeTimeout))
	}
}

// closeLevel is the level to log a connection's error at: Debug for a
// client that closed its end (EOF, ECONNRESET, EPIPE, a closed
// connection), which is how clients end; Warn otherwise.
func closeLevel(err error) slog.Level {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return slog.LevelDebug
	}
	return slog.LevelWarn
}

// decodeControl decodes and checks a control frame: its msgpack
// (wire.DecodeControl), then its slots, in range and at most
// session.MaxSlots of each list. Errors are answered 400.
func decodeControl(b []byte) (wire.StreamControl, error) {
	f, err := wire.DecodeControl(b)
	if err != nil {
		return f, err
	}
	if err := session.CheckSlots("release", f.Release); err != nil {
		return f, fmt.Errorf("control frame: %w", err)
	}
	if err := session.CheckSlots("keep", f.Keep); err != nil {
		return f, fmt.Errorf("control frame: %w", err)
	}
	return f, nil
}
