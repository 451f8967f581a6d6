package testutil

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"io"
	"net"
	"path"
	"strconv"
	"syscall"
	"testing"
)

// ClosedAddr is a loopback address that refuses connections until the
// test ends. Its port is bound, without SO_REUSEADDR, by a socket that
// never listens: no other listener (another test's, in this process or
// another) can take the port while the test relies on it being closed.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatalf("reserve a closed port: socket: %v", err)
	}
	syscall.CloseOnExec(fd)
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("reserve a closed port: bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("reserve a closed port: getsockname: %v", err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}

// FreeAddr is a loopback address whose port was free a moment ago, for a
// server the test starts (redis-server) to listen on.
func FreeAddr(t testing.TB) string {
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
