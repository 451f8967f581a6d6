# tether's container image: the static tether binary, CA certificates and a
# non-root user, on an empty base. Build it with `make image`, which compiles
# the binary and stages everything this file copies into bin/image/ (the build
# context), so no base image is pulled:
#
#   make image IMAGE=registry.example.com/tether
#
# The image has no shell: Kubernetes probes are HTTP and the pre-stop delay
# uses the kubelet's sleep action.
FROM scratch

ARG VERSION=dev
LABEL org.opencontainers.image.title="tether" \
      org.opencontainers.image.description="Reverse-tunnel server and client: tether server, tether client" \
      org.opencontainers.image.source="https://github.com/tether-dev/tether" \
      org.opencontainers.image.version="${VERSION}"

# /etc/passwd and /etc/group name the nonroot user (65532); the CA bundle lets
# the client verify a server certificate issued by a public CA.
COPY etc/ /etc/
COPY tether /usr/local/bin/tether

ENV PATH=/usr/local/bin \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt

USER 65532:65532
ENTRYPOINT ["tether"]
