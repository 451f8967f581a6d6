#!/bin/sh
# Builds tether's container image from a staged build context (see the
# Dockerfile and `make image`) with the first container engine that works:
# docker (when its engine answers), podman, then buildah.
#
#   deploy/image.sh CONTEXT_DIR DOCKERFILE IMAGE_REF VERSION
#
# CONTAINER_ENGINE=docker|podman|buildah picks one explicitly.
set -eu

context=$1
dockerfile=$2
ref=$3
version=$4

engine=${CONTAINER_ENGINE:-}
docker_down=
if [ -z "$engine" ]; then
	for candidate in docker podman buildah; do
		command -v "$candidate" >/dev/null 2>&1 || continue
		if [ "$candidate" = docker ] && ! docker info >/dev/null 2>&1; then
			docker_down=1
			continue
		fi
		engine=$candidate
		break
	done
fi

if [ -z "$engine" ]; then
	if [ -n "$docker_down" ]; then
		echo "image: docker is installed but its engine does not answer ('docker info' failed), and neither podman nor buildah is installed: start the Docker engine (or point DOCKER_HOST at one), or install podman or buildah, then run 'make image' again" >&2
	else
		echo "image: no container engine found: install docker, podman or buildah, then run 'make image' again" >&2
	fi
	exit 1
fi
command -v "$engine" >/dev/null 2>&1 || {
	echo "image: CONTAINER_ENGINE=$engine is not installed: install it, or unset CONTAINER_ENGINE to pick docker, podman or buildah" >&2
	exit 1
}

echo "image: building $ref with $engine"
case $engine in
buildah) exec buildah bud --format oci --build-arg "VERSION=$version" -f "$dockerfile" -t "$ref" "$context" ;;
*) exec "$engine" build --build-arg "VERSION=$version" -f "$dockerfile" -t "$ref" "$context" ;;
esac
