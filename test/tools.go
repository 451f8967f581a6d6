//go:build tools

// This file is never compiled. It keeps in go.mod and go.sum the modules
// that frp's own frpc needs, so that the end-to-end tests can build a stock
// frpc from the pinned frp module (`go build -tags noweb
// github.com/fatedier/frp/cmd/frpc`) and prove that it works as a tunnel
// client and is held to the same tenancy rules.
package test

import _ "github.com/fatedier/frp/cmd/frpc/sub"
