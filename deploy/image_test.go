package deploy

import (
	"bufio"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
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

// containerEngine returns a container engine that can run containers here.
func containerEngine() string {
	if exec.Command("docker", "info").Run() == nil {
		return "docker"
	}
	if exec.Command("podman", "info").Run() == nil {
		return "podman"
	}
	return ""
}

// TestImage builds the image with `make image` and runs `tether version`
// in it.
func TestImage(t *testing.T) {
	engine := containerEngine()
	if engine == "" {
		t.Skip("no container engine is available here ('docker info' and 'podman info' fail): the image is not built; TestImageContext checks its contents")
	}
	ref := "tether-image-test:" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	cmd := exec.Command("make", "image", "IMAGE_CONTEXT="+t.TempDir(), "IMAGE="+strings.Split(ref, ":")[0], "IMAGE_TAG="+strings.Split(ref, ":")[1])
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CONTAINER_ENGINE="+engine)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command(engine, "rmi", ref).Run() })
	out, err := exec.Command(engine, "run", "--rm", ref, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s run %s version: %v\n%s", engine, ref, err, out)
	}
	if !strings.Contains(string(out), "tether") {
		t.Errorf("tether version in the image printed %q", out)
	}
	user, err := exec.Command(engine, "image", "inspect", "--format", "{{.Config.User}}", ref).Output()
	if err != nil || strings.TrimSpace(string(user)) != "65532:65532" {
		t.Errorf("image user %q (%v); want 65532:65532", user, err)
	}
}
