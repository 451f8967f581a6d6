package deploy

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tether-dev/tether/internal/testutil"
)

// TestImageContext stages the image's build context the way `make image`
// does and checks what the FROM scratch image will hold.
func TestImageContext(t *testing.T) {
	ctx := t.TempDir()
	cmd := exec.Command("make", "image-context", "IMAGE_CONTEXT="+ctx)
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make image-context: %v\n%s", err, out)
	}

	// A static binary: no program interpreter, no shared libraries.
	f, err := elf.Open(filepath.Join(ctx, "tether"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("tether in the image is dynamically linked (has PT_INTERP); build it with CGO_ENABLED=0")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) != 0 {
		t.Errorf("tether in the image needs shared libraries %v", libs)
	}
	if out, err := exec.Command(filepath.Join(ctx, "tether"), "version").CombinedOutput(); err != nil {
		t.Errorf("staged tether version: %v\n%s", err, out)
	}

	passwd, err := os.ReadFile(filepath.Join(ctx, "etc", "passwd"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^nonroot:x:65532:65532:`).Match(passwd) {
		t.Errorf("etc/passwd has no nonroot user 65532:\n%s", passwd)
	}
	ca, err := os.ReadFile(filepath.Join(ctx, "etc", "ssl", "certs", "ca-certificates.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(ca), "-----BEGIN CERTIFICATE-----"); n < 10 {
		t.Errorf("CA bundle holds %d certificates; want a system bundle", n)
	}

	// The Dockerfile copies only what was staged and runs as nonroot.
	df, err := os.ReadFile(filepath.Join("..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var from, user, entrypoint string
	sc := bufio.NewScanner(strings.NewReader(string(df)))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		switch fields[0] {
		case "FROM":
			from = fields[1]
		case "USER":
			user = fields[1]
		case "ENTRYPOINT":
			entrypoint = strings.Join(fields[1:], " ")
		case "COPY":
			for _, src := range fields[1 : len(fields)-1] {
				if _, err := os.Stat(filepath.Join(ctx, src)); err != nil {
					t.Errorf("Dockerfile copies %s, which make image-context does not stage", src)
				}
			}
		}
	}
	if from != "scratch" || user != "65532:65532" || entrypoint != `["tether"]` {
		t.Errorf("Dockerfile FROM %s, USER %s, ENTRYPOINT %s; want scratch, 65532:65532, [\"tether\"]", from, user, entrypoint)
	}
}

// TestImageWithoutEngine: with no working container engine, the image build
// says what is missing and what to do.
func TestImageWithoutEngine(t *testing.T) {
	for name, docker := range map[string]string{
		"none":              "",
		"docker, no engine": "#!/bin/sh\nexit 1\n",
	} {
		t.Run(name, func(t *testing.T) {
			bin := t.TempDir()
			if docker != "" {
				if err := os.WriteFile(filepath.Join(bin, "docker"), []byte(docker), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command("/bin/sh", "image.sh", "ctx", "Dockerfile", "tether:test", "test")
			cmd.Env = []string{"PATH=" + bin}
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("image.sh succeeded without a container engine:\n%s", out)
			}
			want := "no container engine found: install docker, podman or buildah"
			if docker != "" {
				want = "docker is installed but its engine does not answer"
			}
			if !strings.Contains(string(out), want) {
				t.Errorf("image.sh said %q; want %q", out, want)
			}
		})
	}
}

// containerEngine returns a container engine whose daemon or storage
// answers, or why there is none.
func containerEngine() (engine, why string) {
	var reasons []string
	for _, e := range []string{"docker", "podman"} {
		if _, err := exec.LookPath(e); err != nil {
			reasons = append(reasons, e+" is not installed")
			continue
		}
		out, err := exec.Command(e, "info").CombinedOutput()
		if err == nil {
			return e, ""
		}
		reasons = append(reasons, fmt.Sprintf("'%s info' failed: %s", e, firstLine(string(out))))
	}
	return "", strings.Join(reasons, "; ")
}

// runArgs are the `ENGINE run` options that let a container start where
// tests run: podman with runc when it is installed, as crun fails in
// sandboxes that refuse it the container's rlimits, and rlimits no higher
// than a sandbox grants.
func runArgs(engine string) []string {
	args := []string{"run", "--rm", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"}
	if _, err := exec.LookPath("runc"); err == nil && engine == "podman" {
		args = append(args, "--runtime", "runc")
	}
	return args
}

// cannotRun reports whether a failed `ENGINE run` failed for the machine,
// not the image: the runtime could not set up the container's limits or
// cgroups.
var cannotRun = regexp.MustCompile(`(?i)setrlimit|error setting rlimit|cgroups? .*not supported|OCI permission denied`)

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}

// TestImage builds the image with `make image` and runs it as the charts
// do (user 65532, read-only root, /tmp a tmpfs): `tether version`, and
// `tether diagnose --bundle -`, whose archive reaches stdout although
// nothing in the container is writable but /tmp.
func TestImage(t *testing.T) {
	engine, why := containerEngine()
	if engine == "" {
		t.Skipf("no container engine answers here (%s): the image is neither built nor run; TestImageContext checks what it holds", why)
	}
	ref := "tether-image-test:" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	cmd := exec.Command("make", "image", "IMAGE_CONTEXT="+t.TempDir(), "IMAGE="+strings.Split(ref, ":")[0], "IMAGE_TAG="+strings.Split(ref, ":")[1])
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CONTAINER_ENGINE="+engine)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command(engine, "rmi", ref).Run() })
	user, err := exec.Command(engine, "image", "inspect", "--format", "{{.Config.User}}", ref).Output()
	if err != nil || strings.TrimSpace(string(user)) != "65532:65532" {
		t.Errorf("image user %q (%v); want 65532:65532", user, err)
	}

	asInPod := append(runArgs(engine), "--read-only", "--tmpfs", "/tmp", "--user", "65532:65532", "--network", "none", ref)
	out, err := exec.Command(engine, append(asInPod, "version")...).CombinedOutput()
	if err != nil && cannotRun.Match(out) {
		t.Skipf("%s built the image but cannot start a container on this machine: %s (install runc for podman: apt-get install runc)", engine, firstLine(string(out)))
	}
	if err != nil {
		t.Fatalf("%s run %s version: %v\n%s", engine, ref, err, out)
	}
	if !strings.Contains(string(out), "tether") {
		t.Errorf("tether version in the image printed %q", out)
	}

	var stdout, stderr bytes.Buffer
	diag := exec.Command(engine, append(asInPod, "diagnose", "--bundle", "-", "--server", "127.0.0.1:1", "--token-file", "/nonexistent", "--timeout", "1s")...)
	diag.Stdout, diag.Stderr = &stdout, &stderr
	_ = diag.Run() // checks fail: no server, no token
	files := testutil.UntarGz(t, &stdout)
	if _, ok := files["report.json"]; !ok {
		t.Errorf("the bundle from the container has %v; want report.json among them\nstderr: %s", files, stderr.String())
	}
}
