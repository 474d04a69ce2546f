// SPDX-License-Identifier: Apache-2.0

package wire

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// The protocol's version, exchanged in headers on every request and
// answer (docs/protocol.md, Versions). A client sends ProtocolHeader and
// ReleaseHeader; the daemon answers with ProtocolHeader, ReleaseHeader and
// FeaturesHeader. A request without ProtocolHeader is protocol 1's: the
// release before versions were exchanged, which sent none.
const (
	// Protocol is the version of the protocol this daemon speaks. It goes
	// up by one whenever a request or answer changes in a way one side
	// must know of (a key, a value, a default); a feature names what came.
	Protocol = 3
	// OldestClientProtocol is the oldest client protocol this daemon
	// serves: requests of that protocol keep its meanings and defaults.
	OldestClientProtocol = 1
	// UnversionedProtocol is the protocol of a request or answer that
	// names none (the release before versions were exchanged).
	UnversionedProtocol = 1

	// ProtocolHeader carries a side's protocol, a decimal integer.
	ProtocolHeader = "Nvfeed-Protocol"
	// ReleaseHeader carries a side's release (python/nvfeed/VERSION).
	ReleaseHeader = "Nvfeed-Release"
	// FeaturesHeader carries the daemon's features, comma-separated.
	FeaturesHeader = "Nvfeed-Features"
)

// CodeVersion is the error code of a refusal for want of a version: a
// client older than OldestClientProtocol, or a newer client's request
// that needs what this daemon lacks. The message names both versions and
// what to upgrade.
const CodeVersion = "version"

// ErrVersion is wrapped by errors that refuse a request for its client's
// version; a transport answers it as a bad request with CodeVersion.
var ErrVersion = errors.New("versions differ")

// Features lists what this daemon serves that a client may need to know
// of before it sends a request, by name, in the order of
// FeaturesHeader. Protocol 1 had them all; a feature added later is
// appended with the protocol it came in (docs/protocol.md).
func Features() []string {
	return []string{"file", "numpy", "webdataset", "roi", "files", "shuffle_after_epoch", "device_uuid", "stream", "versions", "content", "stages"}
}

// FieldFeatures maps an open request's keys to the feature they need: a
// client leaves a key out, where its value is the default, of a daemon
// that lacks its feature, and refuses a value that is not (naming both
// versions). The client's own table (python/nvfeed/_version.py) is
// tested equal to it.
func FieldFeatures() map[string]string {
	return map[string]string{
		"ext": "webdataset", "missing_component_behavior": "webdataset", "case_sensitive_extensions": "webdataset",
		"roi": "roi", "files": "files", "shuffle_after_epoch": "shuffle_after_epoch",
		"shuffle_after_epoch_seed": "shuffle_after_epoch", "device_uuid": "device_uuid",
	}
}

// ParseProtocol reads a ProtocolHeader value: "" is UnversionedProtocol;
// anything but a decimal integer in [0, 1<<20] is an error wrapping
// ErrVersion.
func ParseProtocol(v string) (int, error) {
	if v == "" {
		return UnversionedProtocol, nil
	}
	p, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || p < 0 || p > 1<<20 {
		return 0, fmt.Errorf("%w: %s %q is not a protocol version (a decimal integer)", ErrVersion, ProtocolHeader, v)
	}
	return p, nil
}

// Side is one end of a connection as its headers describe it: its
// protocol and release ("" when it named none).
type Side struct {
	Name     string // "loaderd" or "nvfeed"
	Protocol int
	Release  string
}

// String names the side as an error does: "nvfeed 0.3.0 (protocol 2)",
// or for a side that sent no version "nvfeed of protocol 1 (it sends no
// version: the release before versions were exchanged)".
func (s Side) String() string {
	if s.Release == "" {
		return fmt.Sprintf("%s of protocol %d (it sends no version: the release before versions were exchanged)", s.Name, s.Protocol)
	}
	return fmt.Sprintf("%s %s (protocol %d)", s.Name, s.Release, s.Protocol)
}

// UnknownField returns the key a Decode error refused as unknown.
func UnknownField(err error) (string, bool) {
	const mark = "msgpack: unknown field "
	s := err.Error()
	i := strings.Index(s, mark)
	if i < 0 {
		return "", false
	}
	f, qerr := strconv.Unquote(s[i+len(mark):])
	if qerr != nil {
		return "", false
	}
	return f, true
}

// CheckClient refuses a client the daemon d cannot serve: older than
// OldestClientProtocol ("upgrade the client"), or, for decodeErr (a
// Decode error, nil for none) refusing a key, newer than d and so
// sending what d does not know ("upgrade loaderd"). Errors wrap
// ErrVersion; nil means the request is the client's own to answer for.
func CheckClient(d, client Side, decodeErr error) error {
	if client.Protocol < OldestClientProtocol {
		return fmt.Errorf("%w: this client, %s, is older than the oldest this daemon, %s, serves (protocol %d): upgrade the client (pip install -U nvfeed, or the job's image)",
			ErrVersion, client, d, OldestClientProtocol)
	}
	if decodeErr == nil || client.Protocol <= d.Protocol {
		return nil
	}
	if f, ok := UnknownField(decodeErr); ok {
		return fmt.Errorf("%w: this daemon, %s, does not know the key %q that this client, %s, sent: upgrade loaderd on this node to a release of protocol %d or later, or leave out what needs it",
			ErrVersion, d, f, client, client.Protocol)
	}
	return nil
}
