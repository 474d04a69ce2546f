// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// unixServe serves on a unix socket with serve (each accepted
// connection) until the test ends.
func unixServe(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "other.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return sock
}

// loaderd status on another service's socket says it answered, but not
// as loaderd, and what it answered: an HTTP service's page, a service
// that does not speak HTTP's banner.
func TestStatusOfAnotherService(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Server", "nginx/1.25")
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte("<html><body>404 Not Found</body></html>\n"))
	})
	web := unixServe(t, func(c net.Conn) {
		srv := &http.Server{Handler: mux}
		srv.Serve(&oneConn{c: c})
	})
	ssh := unixServe(t, func(c net.Conn) {
		defer c.Close()
		c.Write([]byte("SSH-2.0-OpenSSH_9.2\r\n"))
		bufio.NewReader(c).ReadString('\n') // the client's first line, then the connection closes
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct{ sock, want string }{
		{web, `an HTTP service answered 404 Not Found, text/html; charset=utf-8 (Server: nginx/1.25): "<html><body>404 Not Found</body></html>"`},
		{ssh, `it does not speak HTTP; it wrote "SSH-2.0-OpenSSH_9.2"`},
	} {
		_, err := RequestStatus(ctx, c.sock)
		if !errors.Is(err, ErrNotLoaderd) || !strings.Contains(err.Error(), "the socket at "+c.sock+" answered, but not as loaderd") ||
			!strings.Contains(err.Error(), c.want) {
			t.Errorf("status of %s: %v, want ErrNotLoaderd with %s", c.sock, err, c.want)
		}
	}
	// loaderd's own answer passes.
	f := start(t, time.Minute)
	if _, err := RequestStatus(ctx, f.sock); err != nil {
		t.Errorf("status of loaderd: %v", err)
	}
}

// oneConn is a listener of one connection.
type oneConn struct {
	c    net.Conn
	done bool
}

func (o *oneConn) Accept() (net.Conn, error) {
	if o.done {
		return nil, net.ErrClosed
	}
	o.done = true
	return o.c, nil
}
func (o *oneConn) Close() error   { return nil }
func (o *oneConn) Addr() net.Addr { return o.c.LocalAddr() }
