package testutil

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"io"
	"net"
	"path"
	"testing"
)

// ClosedAddr is a loopback address where nothing listens: a port that was
// just free, so connecting to it is refused.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// UntarGz returns the files of a .tar.gz (such as a diagnose bundle) by base
// name.
func UntarGz(t testing.TB, r io.Reader) map[string]string {
	t.Helper()
	gz, err := gzip.NewReader(r)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	files := map[string]string{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[path.Base(hdr.Name)] = string(data)
	}
}
