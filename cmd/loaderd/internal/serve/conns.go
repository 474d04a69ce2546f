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

// connCaps are the connection limits a peerListener keeps.
type connCaps struct {
	perPeer int // a peer's open connections
	// total bounds every peer's together (below the fd limit), of which
	// rootOnly are kept for uid 0 on the unix socket: the others stop at
	// total - rootOnly.
	total, rootOnly int
	// counted is shared by the daemon's listeners (unix and TCP): the
	// connections open, all peers together. Nil: the listener's own.
	counted *totalConns
}

// totalConns counts every listener's open connections together.
type totalConns struct {
	mu     sync.Mutex
	n      int  // under mu
	warned bool // under mu: a refusal past the total was logged since n was last below it
}

// rootKey is uid 0's key on the unix socket.
const rootKey = "0"

// peerListener counts open connections per peer and in total; a peer is a uid, or all of TCP.
// Past a peer's cap or the total, less root's reserve, it answers 429 and closes.
// So no user's flood takes the descriptors of others or of root.
// A unix connection whose peer cannot be identified is closed.
type peerListener struct {
	net.Listener
	caps connCaps
	log  *slog.Logger
	busy chan struct{} // refusals being answered

	mu   sync.Mutex
	open map[string]int // under mu: connections by peer
	full map[string]bool
}

func newPeerListener(ln net.Listener, caps connCaps, log *slog.Logger) *peerListener {
	if caps.counted == nil {
		caps.counted = &totalConns{}
	}
	return &peerListener{Listener: ln, caps: caps, log: log, busy: make(chan struct{}, refusals), open: map[string]int{}, full: map[string]bool{}}
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
		if why := l.take(key, who); why != "" {
			l.refuse(c, key, who, why)
			continue
		}
		done := func() { l.give(key) }
		if isUnix {
			return &unixConn{UnixConn: uc, cred: cr, done: done}, nil
		}
		return &tcpConn{Conn: c, done: done}, nil
	}
}

// take counts a connection of key's (who, in words), or says which
// limit it is over.
func (l *peerListener) take(key, who string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.open[key]; n >= l.caps.perPeer {
		return fmt.Sprintf("%s, %d open, the daemon's limit per uid (--max-conns-per-uid)", who, n)
	}
	t := l.caps.counted
	t.mu.Lock()
	defer t.mu.Unlock()
	limit := l.caps.total
	if key != rootKey || l.isTCP() {
		limit -= l.caps.rootOnly
	}
	if t.n >= limit {
		if !t.warned { // once per flood, not once per connection
			t.warned = true
			l.log.Warn("serve: connections refused: the daemon's limit for all users", "open", t.n, "max_conns", l.caps.total, "kept_for_root", l.caps.rootOnly)
		}
		return fmt.Sprintf("%d open, all users together, the daemon's limit (--max-conns %d, of which %d kept for root)", t.n, l.caps.total, l.caps.rootOnly)
	}
	t.n++
	l.open[key]++
	return ""
}

// isTCP says whether l listens on TCP (whose peers are never root).
func (l *peerListener) isTCP() bool {
	_, ok := l.Listener.Addr().(*net.TCPAddr)
	return ok
}

// give gives back a place of key's.
func (l *peerListener) give(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key]--; l.open[key] <= 0 {
		delete(l.open, key)
		delete(l.full, key)
	}
	t := l.caps.counted
	t.mu.Lock()
	if t.n--; t.n < l.caps.total-l.caps.rootOnly {
		t.warned = false
	}
	t.mu.Unlock()
}

// refuse answers c 429 at once and closes it, reading the request off in the background.
func (l *peerListener) refuse(c net.Conn, key, who, why string) {
	l.mu.Lock()
	first := !l.full[key] && l.open[key] > 0 // a peer refused past the total was logged by take
	if l.open[key] > 0 {
		l.full[key] = true
	}
	l.mu.Unlock()
	msg := "too many connections: " + why
	if first { // once per flood, not once per connection
		l.log.Warn("serve: connections refused", "peer", who, "why", why)
	}
	body, _ := msgpack.Marshal(wire.ErrorResponse{Error: msg})
	c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	fmt.Fprintf(c, "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/msgpack\r\nContent-Length: %d\r\nConnection: close\r\n%s: %d\r\n\r\n%s",
		len(body), wire.ProtocolHeader, wire.Protocol, body)
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
