module example.com/thirdparty

go 1.26.0

require github.com/nvfeed/nvfeed v0.0.0

require (
	github.com/ebitengine/purego v0.11.3 // indirect
	github.com/ncw/directio v1.0.5 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

replace github.com/nvfeed/nvfeed => ../../..
