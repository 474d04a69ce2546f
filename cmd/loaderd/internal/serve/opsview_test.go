// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/testenv"
)

// curlAs runs curl --unix-socket as uid (its own process, as an
// operator's shell would) and returns the status, the content type and
// the body.
func curlAs(t *testing.T, sock string, uid uint32, path string, headers ...string) (int, string, []byte) {
	t.Helper()
	args := []string{"-sS", "--unix-socket", sock, "-w", "\n%{http_code} %{content_type}"}
	for _, h := range headers {
		args = append(args, "-H", h)
	}
	cmd := exec.Command("curl", append(args, "http://loaderd"+path)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("curl %s as uid %d: %v", path, uid, err)
	}
	i := bytes.LastIndexByte(out, '\n')
	var code int
	var ctype string
	fmt.Sscanf(string(out[i+1:]), "%d %s", &code, &ctype)
	return code, ctype, out[:i]
}

// jsonAs is curlAs asking for JSON: the answer decoded, which must be
// JSON with status 200.
func jsonAs(t *testing.T, sock string, uid uint32, path string) map[string]any {
	t.Helper()
	code, ctype, body := curlAs(t, sock, uid, path, "Accept: application/json")
	var v map[string]any
	if err := json.Unmarshal(body, &v); code != http.StatusOK || ctype != "application/json" || err != nil {
		t.Fatalf("curl %s as uid %d with Accept: application/json: %d %s %v:\n%s", path, uid, code, ctype, err, body)
	}
	return v
}

// byName returns the entry of list (JSON objects) whose key is val.
func byName(t *testing.T, list any, key, val string) map[string]any {
	t.Helper()
	for _, e := range list.([]any) {
		if m := e.(map[string]any); m[key] == val {
			return m
		}
	}
	t.Fatalf("no %s %q in %v", key, val, list)
	return nil
}

// TestOperatorViewWithCurl: what an operator asks, answered by curl over
// the unix socket alone. The read-only endpoints answer JSON to Accept:
// application/json (msgpack without it), by /v1/datasets' rules: nobody
// sees counts of the dataset it may read and only the name of the one it
// may not. GET /v1/status tells root every user's sessions and nobody its
// own, with the budgets used. A chown after mapping makes a sample stale:
// /v1/status names the cause and the fix, /metrics has a gauge per
// dataset and cause, the log says it with the fix. The backends' counters
// in /metrics stay after the sessions that counted them close.
func TestOperatorViewWithCurl(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		testenv.SkipPrivileged(t, "serve: no curl: %v", err)
	}
	a := newAttackFS(t)
	m := a.build(t)
	a.fs.WriteFile(t, "priv/c0/000.jpg", bytes.Repeat([]byte("PRIVATE!"), 300))
	a.fs.Sync(t)
	priv, err := bmap.Build(context.Background(), a.fs.Path("priv"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(a.fs.Path("priv"), 0o700); err != nil {
		t.Fatal(err)
	}
	var log testenv.Buffer
	sock := daemonWith(t, Config{Datasets: map[string]*bmap.Map{"ds": m, "priv": priv}, SessionTimeout: time.Minute,
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	nobodySession, code, msg := connectAs(t, sock, nobodyWho).open("file")
	if code != http.StatusOK {
		t.Fatalf("open as nobody: %d %s", code, msg)
	}
	throwaway, code, msg := connectAs(t, sock, throwawayWho).open("file")
	if code != http.StatusOK {
		t.Fatalf("open as uid %d: %d %s", throwawayWho.uid, code, msg)
	}

	t.Run("msgpack by default", func(t *testing.T) {
		for _, p := range []string{"/v1/datasets", "/v1/backends", "/v1/status"} {
			if code, ctype, _ := curlAs(t, sock, nobodyID, p); code != http.StatusOK || ctype != "application/msgpack" {
				t.Errorf("curl %s without Accept: %d %s, want 200 application/msgpack", p, code, ctype)
			}
		}
		if code, _, body := curlAs(t, sock, nobodyID, "/healthz"); code != http.StatusOK || string(body) != "ok\n" {
			t.Errorf("curl /healthz: %d %q", code, body)
		}
	})
	t.Run("JSON on request", func(t *testing.T) {
		if v := jsonAs(t, sock, nobodyID, "/healthz"); v["status"] != "ok" {
			t.Errorf("/healthz: %v", v)
		}
		if v := jsonAs(t, sock, nobodyID, "/v1/backends"); v["default"] != "file" || v["auto"] != "gds" {
			t.Errorf("/v1/backends: %v", v)
		}
		code, ctype, body := curlAs(t, sock, nobodyID, "/v1/nope", "Accept: application/json")
		if code != http.StatusNotFound || ctype != "application/json" || !strings.Contains(string(body), `"error"`) {
			t.Errorf("an unknown route: %d %s %s, want a JSON error", code, ctype, body)
		}
	})
	t.Run("datasets by the caller's rights", func(t *testing.T) {
		v := jsonAs(t, sock, nobodyID, "/v1/datasets")
		if ds := byName(t, v["datasets"], "name", "ds"); ds["readable"] != true || ds["samples"] != 8.0 || ds["fresh"] != 8.0 {
			t.Errorf("ds to nobody: %v, want its counts", ds)
		}
		p := byName(t, v["datasets"], "name", "priv")
		if _, counted := p["samples"]; p["readable"] != false || counted {
			t.Errorf("priv to nobody: %v, want its name and no count", p)
		}
		if p := byName(t, jsonAs(t, sock, 0, "/v1/datasets")["datasets"], "name", "priv"); p["samples"] != 1.0 {
			t.Errorf("priv to root: %v, want its count", p)
		}
	})
	t.Run("status by the caller's rights", func(t *testing.T) {
		root := jsonAs(t, sock, 0, "/v1/status")
		if s := root["sessions"].([]any); len(s) != 2 {
			t.Errorf("root sees %d sessions, want 2: %v", len(s), s)
		}
		byName(t, root["sessions"], "dataset", "ds")
		if b := byName(t, root["budgets"], "name", "sessions"); b["used"] != 2.0 || b["limit"] != 64.0 {
			t.Errorf("the sessions budget: %v", b)
		}
		for _, name := range []string{"batch_memory", "sample_order_memory", "connections", "sessions_of_the_caller"} {
			byName(t, root["budgets"], "name", name)
		}
		mine := jsonAs(t, sock, nobodyID, "/v1/status")
		s := mine["sessions"].([]any)
		if len(s) != 1 || s[0].(map[string]any)["uid"] != float64(nobodyID) {
			t.Errorf("nobody sees %v, want its own session only", s)
		}
		if p := byName(t, mine["datasets"], "name", "priv"); p["stale_causes"] != nil || p["samples"] != nil {
			t.Errorf("priv in nobody's status: %v", p)
		}
	})
	t.Run("stale samples: metrics, log, status", func(t *testing.T) {
		if err := os.Chown(a.fs.Path("data/c0/001.jpg"), int(throwawayWho.uid)+100, int(throwawayWho.gid)+100); err != nil {
			t.Fatal(err)
		}
		gauge := regexp.MustCompile(`(?m)^nvfeed_dataset_stale_samples\{cause="changed_since_mapping",dataset="ds"\} 1$`)
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			_, _, metrics := curlAs(t, sock, 0, "/metrics")
			if gauge.Match(metrics) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("/metrics lacks the stale gauge after the chown:\n%s", grepLines(metrics, "nvfeed_dataset"))
			}
		}
		if l := log.String(); !strings.Contains(l, "1 raw-mapped samples changed since mapping") || !strings.Contains(l, "chown -R") || !strings.Contains(l, "mkbmap") {
			t.Errorf("the log does not say it with the fix:\n%s", l)
		}
		ds := byName(t, jsonAs(t, sock, 0, "/v1/status")["datasets"], "name", "ds")
		cs, _ := ds["stale_causes"].([]any)
		if len(cs) != 1 {
			t.Fatalf("stale causes: %v", ds)
		}
		if c := cs[0].(map[string]any); c["cause"] != "changed_since_mapping" || c["samples"] != 1.0 || !strings.Contains(c["fix"].(string), "mkbmap") {
			t.Errorf("the cause: %v", c)
		}
	})
	t.Run("backend counters outlive their sessions", func(t *testing.T) {
		nobodySession.epoch(m)
		for _, s := range []*attackSession{nobodySession, throwaway} {
			if code, msg := s.c.call("DELETE", "/v1/sessions/"+s.id, nil, nil); code != http.StatusNoContent {
				t.Fatalf("close: %d %s", code, msg)
			}
		}
		_, _, metrics := curlAs(t, sock, 0, "/metrics")
		if !regexp.MustCompile(`(?m)^nvfeed_backend\{backend="file",counter="[a-z_]+",dataset="ds"\} [1-9]`).Match(metrics) {
			t.Errorf("no backend counter of ds after its sessions closed:\n%s", grepLines(metrics, "nvfeed_backend"))
		}
	})
}

// grepLines returns the lines of b that contain s.
func grepLines(b []byte, s string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
