// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"os"
	"strings"
)

// A config file holds flags, one per line, as on the command line without the dashes:
//
//	# /etc/loaderd/loaderd.conf
//	socket = /run/loaderd/loaderd.sock
//	socket-group = loaderd
//	dataset = imagenet=/data/imagenet/train.bmap
//	dataset = openimages=/data/openimages/train.bmap
//	session-timeout = 60s
//
// Blank lines and lines starting with # are ignored; a repeatable flag may repeat.
// A flag given on the command line wins over all of the file's lines for it.

// configLine is one setting of a config file.
type configLine struct {
	line       int
	key, value string
}

// parseConfig reads a config file's settings; errors name the line.
func parseConfig(data []byte) ([]configLine, error) {
	var out []configLine
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		key, value, ok := strings.Cut(text, "=")
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if !ok || key == "" {
			return nil, fmt.Errorf("line %d: want KEY = VALUE, got %q", n, text)
		}
		if strings.HasPrefix(key, "-") {
			return nil, fmt.Errorf("line %d: %q: write flags without dashes", n, key)
		}
		out = append(out, configLine{n, key, value})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// applyConfig sets fs's flags from the file at path, except those given on
// the command line (already parsed into fs) and the config flag itself.
func applyConfig(fs *flag.FlagSet, path string) error {
	lines, err := readConfig(path)
	if err != nil {
		return err
	}
	given := map[string]bool{"config": true}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, l := range lines {
		if fs.Lookup(l.key) == nil {
			return fmt.Errorf("config %s: line %d: unknown setting %q (see loaderd serve --help)", path, l.line, l.key)
		}
		if given[l.key] {
			continue
		}
		if err := fs.Set(l.key, l.value); err != nil {
			return fmt.Errorf("config %s: line %d: %s: %w", path, l.line, l.key, err)
		}
	}
	return nil
}

// configDatasets returns the dataset lines of the config file at path,
// NAME -> MAPFILE, read now (a reload's datasets when the command line
// named none).
func configDatasets(path string) (map[string]string, error) {
	lines, err := readConfig(path)
	if err != nil {
		return nil, err
	}
	d := datasetFlags{}
	for _, l := range lines {
		if l.key != "dataset" {
			continue
		}
		if err := d.Set(l.value); err != nil {
			return nil, fmt.Errorf("config %s: line %d: dataset: %w", path, l.line, err)
		}
	}
	if len(d) == 0 {
		return nil, fmt.Errorf("config %s: no dataset line", path)
	}
	return d, nil
}

// configValue returns the last value of key in the config file at path
// ("" if none).
func configValue(path, key string) (string, error) {
	lines, err := readConfig(path)
	if err != nil {
		return "", err
	}
	v := ""
	for _, l := range lines {
		if l.key == key {
			v = l.value
		}
	}
	return v, nil
}

// readConfig reads and parses the config file at path.
func readConfig(path string) ([]configLine, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	lines, err := parseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return lines, nil
}
