// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/internal/cred"
)

// refusals bounds the refused connections being answered at once; past
// it a refused connection is closed without an answer.
const refusals = 32

// peerListener counts the open connections of each peer (a uid, from
// SO_PEERCRED at accept; every TCP connection is one peer) and refuses a
// peer's connection past max: it answers 429 naming the limit and closes
// it, so one user's flood of connections cannot take the daemon's file
// descriptors from the others. A unix connection whose peer cannot be
// identified is closed.
type peerListener struct {
	net.Listener
	max  int
	log  *slog.Logger
	busy chan struct{} // refusals being answered

	mu   sync.Mutex
	open map[string]int // under mu: connections by peer
	full map[string]bool
}

func newPeerListener(ln net.Listener, max int, log *slog.Logger) *peerListener {
	return &peerListener{Listener: ln, max: max, log: log, busy: make(chan struct{}, refusals), open: map[string]int{}, full: map[string]bool{}}
}

// unixConn is an accepted unix connection with its peer's credentials,
// taken at accept.
type unixConn struct {
	*net.UnixConn
	cred cred.Cred
	done func()
	once sync.Once
}

// Close closes the connection and gives its place back.
func (c *unixConn) Close() error {
	c.once.Do(c.done)
	return c.UnixConn.Close()
}

// tcpConn is an accepted TCP connection.
type tcpConn struct {
	net.Conn
	done func()
	once sync.Once
}

// Close closes the connection and gives its place back.
func (c *tcpConn) Close() error {
	c.once.Do(c.done)
	return c.Conn.Close()
}

// Accept returns the next connection within its peer's limit.
func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key, who := "tcp", "TCP clients (together)"
		var cr cred.Cred
		uc, isUnix := c.(*net.UnixConn)
		if isUnix {
			if cr, err = peerCred(uc); err != nil {
				l.log.Warn("serve: connection of unknown peer closed", "err", err)
				c.Close()
				continue
			}
			key, who = fmt.Sprint(cr.UID), fmt.Sprintf("uid %d", cr.UID)
		}
		if !l.take(key) {
			l.refuse(c, key, who)
			continue
		}
		done := func() { l.give(key) }
		if isUnix {
			return &unixConn{UnixConn: uc, cred: cr, done: done}, nil
		}
		return &tcpConn{Conn: c, done: done}, nil
	}
}

// take counts a connection of key's, or says it is over the limit.
func (l *peerListener) take(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key] >= l.max {
		return false
	}
	l.open[key]++
	return true
}

// give gives back a place of key's.
func (l *peerListener) give(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key]--; l.open[key] <= 0 {
		delete(l.open, key)
		delete(l.full, key)
	}
}

// refuse answers c 429 and closes it, without holding up Accept: the
// answer is written at once (a new connection's buffer has room) and the
// request read off for a moment in the background, so that a client that
// writes its request first still reads the answer.
func (l *peerListener) refuse(c net.Conn, key, who string) {
	l.mu.Lock()
	first := !l.full[key]
	l.full[key] = true
	l.mu.Unlock()
	msg := fmt.Sprintf("too many connections: %s, %d open, the daemon's limit per uid (--max-conns-per-uid)", who, l.max)
	if first { // once per flood, not once per connection
		l.log.Warn("serve: connections refused", "peer", who, "limit", l.max)
	}
	body, _ := msgpack.Marshal(wire.ErrorResponse{Error: msg})
	c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	fmt.Fprintf(c, "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/msgpack\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	select {
	case l.busy <- struct{}{}:
		go func() {
			defer func() { <-l.busy }()
			c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			io.Copy(io.Discard, io.LimitReader(c, wire.MaxBody))
			c.Close()
		}()
	default:
		c.Close()
	}
}

// peerCred returns the credentials of c's peer (SO_PEERCRED, SO_PEERGROUPS).
func peerCred(c *net.UnixConn) (cred.Cred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return cred.Cred{}, err
	}
	var cr cred.Cred
	var perr error
	if err := raw.Control(func(fd uintptr) { cr, perr = cred.Peer(int(fd)) }); err != nil {
		return cred.Cred{}, err
	}
	return cr, perr
}
