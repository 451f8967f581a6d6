package deploy

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/tether-dev/tether/internal/version"
)

// TestRelease runs `make release` for the charts' appVersion, as a release
// would, and checks what it made: a static binary per platform that reports
// the version, checksums that verify, an SBOM that lists frp, the charts
// with the release's version and appVersion, and, where buildah or podman
// is installed, an OCI image archive for both platforms.
func TestRelease(t *testing.T) {
	ver := chartMeta(t, serverChart).AppVersion
	frp := frpVersion(t)
	semver := strings.TrimPrefix(ver, "v")
	dist := t.TempDir()
	cmd := exec.Command("make", "release", "VERSION="+ver, "DIST="+dist)
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make release VERSION=%s: %v\n%s", ver, err, out)
	}

	// SHA256SUMS covers every other file, and each verifies.
	sums := readSums(t, filepath.Join(dist, "SHA256SUMS"))
	entries, err := os.ReadDir(dist)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == "SHA256SUMS" {
			continue
		}
		want, ok := sums[e.Name()]
		if !ok {
			t.Errorf("SHA256SUMS does not list %s", e.Name())
			continue
		}
		if got := sha256File(t, filepath.Join(dist, e.Name())); got != want {
			t.Errorf("%s: sha256 %s; SHA256SUMS says %s", e.Name(), got, want)
		}
		delete(sums, e.Name())
	}
	for name := range sums {
		t.Errorf("SHA256SUMS lists %s, which is not in the release", name)
	}

	for arch, machine := range map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64} {
		bin := filepath.Join(dist, "tether-linux-"+arch)
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatalf("%s: %v", bin, err)
		}
		if f.Machine != machine {
			t.Errorf("tether-linux-%s is built for %v", arch, f.Machine)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("tether-linux-%s is dynamically linked", arch)
			}
		}
		_ = f.Close()
		if arch != runtime.GOARCH || runtime.GOOS != "linux" {
			continue
		}
		out, err := exec.Command(bin, "version", "-o", "json").Output()
		if err != nil {
			t.Fatalf("tether-linux-%s version -o json: %v", arch, err)
		}
		var info version.Info
		if err := json.Unmarshal(out, &info); err != nil || info.Version != ver || info.FRP != frp {
			t.Errorf("tether-linux-%s version -o json = %s (%v); want version %s, frp %s", arch, out, err, ver, frp)
		}
	}

	checkSBOM(t, filepath.Join(dist, "tether.cdx.json"), frp)

	for _, c := range charts {
		files := untar(t, filepath.Join(dist, c.name+"-"+semver+".tgz"))
		var meta chartYAML
		if err := yaml.Unmarshal(files[c.name+"/Chart.yaml"], &meta); err != nil {
			t.Fatalf("%s: Chart.yaml: %v", c.name, err)
		}
		if meta.Version != semver || meta.AppVersion != ver {
			t.Errorf("packaged %s: version %q, appVersion %q; want %s, %s", c.name, meta.Version, meta.AppVersion, semver, ver)
		}
		if _, ok := files[c.name+"/values.schema.json"]; !ok {
			t.Errorf("packaged %s has no values.schema.json", c.name)
		}
	}
	if _, ok := untar(t, filepath.Join(dist, serverChart.name+"-"+semver+".tgz"))[serverChart.name+"/files/grafana-dashboard.json"]; !ok {
		t.Error("the packaged server chart has no files/grafana-dashboard.json")
	}
	for _, f := range []string{"LICENSE", "NOTICE"} {
		if _, err := os.Stat(filepath.Join(dist, f)); err != nil {
			t.Errorf("the release has no %s", f)
		}
	}

	archive := filepath.Join(dist, "tether-"+ver+"-image.oci.tar")
	if _, err := os.Stat(archive); err != nil {
		_, buildah := exec.LookPath("buildah")
		_, podman := exec.LookPath("podman")
		if buildah == nil || podman == nil {
			t.Fatalf("no image archive although buildah or podman is installed:\n%s", out)
		}
		if !strings.Contains(string(out), "neither buildah nor podman is installed") {
			t.Errorf("no image archive, and make release did not say why:\n%s", out)
		}
		t.Log("no buildah or podman here: the image archive was not built (make release said so)")
		return
	}
	checkImageArchive(t, archive, "ghcr.io/tether-dev/tether:"+ver)
}

// TestReleaseRefusesBadVersions: make release wants vX.Y.Z and a CHANGELOG
// section for it, and says so before building anything.
func TestReleaseRefusesBadVersions(t *testing.T) {
	for v, want := range map[string]string{
		"1.2":    "VERSION=1.2: want vMAJOR.MINOR.PATCH",
		"v9.9.9": "CHANGELOG.md has no section '## [9.9.9]'",
	} {
		dist := t.TempDir()
		cmd := exec.Command("make", "release", "VERSION="+v, "DIST="+dist)
		cmd.Dir = ".."
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("make release VERSION=%s: %v\n%s\nwant a failure saying %q", v, err, out, want)
		}
	}
}

func readSums(t *testing.T, file string) map[string]string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sums := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q is not 'SUM  NAME'", sc.Text())
		}
		sums[name] = sum
	}
	return sums
}

func sha256File(t *testing.T, file string) string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// frpVersion is the version of frp in go.mod.
func frpVersion(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/fatedier/frp")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m github.com/fatedier/frp: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// checkSBOM: a CycloneDX document whose components include frp at the
// version in go.mod.
func checkSBOM(t *testing.T, file, frp string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var bom struct {
		BOMFormat  string `json:"bomFormat"`
		Components []struct {
			Name    string `json:"name"`
			Version string `json:"version"`
			PURL    string `json:"purl"`
		} `json:"components"`
	}
	if err := json.Unmarshal(data, &bom); err != nil {
		t.Fatalf("SBOM: %v", err)
	}
	if bom.BOMFormat != "CycloneDX" {
		t.Errorf("SBOM bomFormat %q; want CycloneDX", bom.BOMFormat)
	}
	var names []string
	for _, c := range bom.Components {
		names = append(names, c.Name+"@"+c.Version)
	}
	if want := "github.com/fatedier/frp@" + frp; !slices.Contains(names, want) {
		t.Errorf("the SBOM does not list %s; it lists %v", want, names)
	}
}

// untar returns the files of a .tgz (or, not compressed, a .tar).
func untar(t *testing.T, file string) map[string][]byte {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(file, ".tgz") {
		gz, err := gzip.NewReader(f)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		r = gz
	}
	files := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[hdr.Name] = data
	}
}

type ociIndex struct {
	Manifests []struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Annotations map[string]string `json:"annotations"`
		Platform    *struct {
			OS           string `json:"os"`
			Architecture string `json:"architecture"`
		} `json:"platform"`
	} `json:"manifests"`
}

// checkImageArchive: an OCI archive whose index names ref and holds an image
// index with a manifest for linux/amd64 and one for linux/arm64.
func checkImageArchive(t *testing.T, archive, ref string) {
	t.Helper()
	files := untar(t, archive)
	var top ociIndex
	if err := json.Unmarshal(files["index.json"], &top); err != nil {
		t.Fatalf("image archive index.json: %v", err)
	}
	if len(top.Manifests) != 1 || top.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != ref {
		t.Fatalf("image archive index.json %+v; want one image index named %s", top, ref)
	}
	var list ociIndex
	blob := "blobs/" + strings.Replace(top.Manifests[0].Digest, ":", "/", 1)
	if err := json.Unmarshal(files[blob], &list); err != nil {
		t.Fatalf("image index %s: %v", blob, err)
	}
	var platforms []string
	for _, m := range list.Manifests {
		if m.Platform != nil {
			platforms = append(platforms, m.Platform.OS+"/"+m.Platform.Architecture)
		}
	}
	slices.Sort(platforms)
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Errorf("image index platforms %v; want linux/amd64 and linux/arm64", platforms)
	}
}
