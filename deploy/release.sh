#!/bin/sh
# Builds a release of tether into a directory (see `make release`):
#
#   deploy/release.sh VERSION DIST
#
#   tether-linux-amd64, tether-linux-arm64   static binaries, stamped with VERSION
#   tether.cdx.json                          CycloneDX SBOM of the module graph
#   tether-server-X.Y.Z.tgz, tether-client-X.Y.Z.tgz
#                                            the charts, version X.Y.Z, appVersion VERSION
#   tether-VERSION-image.oci.tar             the image for both platforms, an OCI
#                                            archive (with buildah or podman)
#   LICENSE, NOTICE
#   SHA256SUMS                               of everything above
#
# GO and HELM name the tools; RELEASE_IMAGE the image's repository
# (ghcr.io/tether-dev/tether, the charts' default); CONTAINER_ENGINE=buildah
# or podman picks the image builder.
set -eu

version=$1
dist=$2
GO=${GO:-go}
HELM=${HELM:-helm}
image=${RELEASE_IMAGE:-ghcr.io/tether-dev/tether}
cyclonedx=github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@v1.10.0

case $version in
v[0-9]*.[0-9]*.[0-9]*) ;;
*)
	echo "release: VERSION=$version: want vMAJOR.MINOR.PATCH, e.g. make release VERSION=v0.1.0" >&2
	exit 2
	;;
esac
semver=${version#v}
if ! grep -q "^## \[$semver\]" CHANGELOG.md; then
	echo "release: CHANGELOG.md has no section '## [$semver]': add one for the release (Keep a Changelog), then run make release again" >&2
	exit 1
fi

rm -rf "$dist"
mkdir -p "$dist"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

ldflags="-s -w -X github.com/tether-dev/tether/internal/version.Version=$version"
for arch in amd64 arm64; do
	echo "release: tether-linux-$arch"
	CGO_ENABLED=0 GOOS=linux GOARCH=$arch "$GO" build -trimpath -ldflags "$ldflags" -o "$dist/tether-linux-$arch" ./cmd/tether
done

echo "release: tether.cdx.json (CycloneDX SBOM of the module graph, $cyclonedx)"
"$GO" run "$cyclonedx" mod -licenses -std -json -output "$dist/tether.cdx.json" .

for chart in tether-server tether-client; do
	"$HELM" package "deploy/helm/$chart" --version "$semver" --app-version "$version" --destination "$dist" >/dev/null
	echo "release: $chart-$semver.tgz (appVersion $version)"
done

cp LICENSE NOTICE "$dist/"

builder=${CONTAINER_ENGINE:-}
if [ -z "$builder" ]; then
	for candidate in buildah podman; do
		if command -v "$candidate" >/dev/null 2>&1; then
			builder=$candidate
			break
		fi
	done
fi
if [ -z "$builder" ]; then
	echo "release: neither buildah nor podman is installed: the image archive is not built (install one, e.g. apt-get install buildah, and run make release again); the rest of the release is" >&2
else
	archive=tether-$version-image.oci.tar
	echo "release: $archive ($image:$version, linux/amd64 and linux/arm64, with $builder)"
	list=tether-release-$$
	"$builder" manifest create "$list" >/dev/null
	ids=
	for arch in amd64 arm64; do
		make -s image-context IMAGE_CONTEXT="$work/ctx-$arch" GOARCH="$arch" VERSION="$version" >/dev/null
		# FROM scratch with COPY only: no emulator is needed for arm64.
		case $builder in
		buildah) build="buildah bud" ;;
		*) build="$builder build" ;;
		esac
		$build --quiet --platform "linux/$arch" --manifest "$list" --iidfile "$work/iid-$arch" \
			--build-arg "VERSION=$version" -f Dockerfile "$work/ctx-$arch" >/dev/null
		ids="$ids $(cat "$work/iid-$arch")"
	done
	"$builder" manifest push --quiet --all --format oci "$list" "oci-archive:$dist/$archive:$image:$version" >/dev/null
	"$builder" manifest rm "$list" >/dev/null
	# shellcheck disable=SC2086 # a list of image IDs
	"$builder" rmi $ids >/dev/null 2>&1 || true
fi

(cd "$dist" && sha256sum -- * >"$work/SHA256SUMS" && mv "$work/SHA256SUMS" SHA256SUMS)
echo "release: $dist/SHA256SUMS"
