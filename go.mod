module github.com/nvfeed/nvfeed

go 1.26.0

require (
	github.com/NVIDIA/go-nvml v0.13.0-1
	github.com/cockroachdb/datadriven v1.0.3
	github.com/ebitengine/purego v0.11.3
	github.com/go-chi/chi/v5 v5.2.3
	github.com/ncw/directio v1.0.5
	github.com/prometheus/client_golang v1.23.2
	github.com/schollz/progressbar/v3 v3.19.1
	github.com/vmihailenco/msgpack/v5 v5.4.1
	golang.org/x/sys v0.49.0
	golang.org/x/term v0.47.0
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/kr/text v0.2.0 // indirect
	github.com/mitchellh/colorstring v0.0.0-20190213212951-d06e56a500db // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	github.com/prometheus/client_model v0.6.2 // indirect
	github.com/prometheus/common v0.66.1 // indirect
	github.com/prometheus/procfs v0.16.1 // indirect
	github.com/rivo/uniseg v0.4.7 // indirect
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	google.golang.org/protobuf v1.36.8 // indirect
)
