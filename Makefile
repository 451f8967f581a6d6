# tether: see README.md. `make help` lists the targets.

GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/tether-dev/tether/internal/version.Version=$(VERSION)
FUZZTIME ?= 10s
BENCH_FLAGS ?=
SCALE_SESSIONS ?= 20000
SCALE_IDLE ?= 60s
GOLANGCI_LINT_VERSION := v2.15.0
GOBIN   ?= $(shell $(GO) env GOPATH)/bin
GOLANGCI := $(GOBIN)/golangci-lint
HELM_VERSION := v3.22.0
HELM    := $(GOBIN)/helm
# The Kubernetes version helm assumes without --kube-version. helm's own
# release builds stamp it; a `go install`-built helm assumes v1.20, older than
# the charts' kubeVersion (>=1.30), and renders them only with --kube-version.
HELM_KUBE_MINOR := 34
HELM_LDFLAGS := -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$(HELM_KUBE_MINOR) \
	-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$(HELM_KUBE_MINOR)
IMAGE   ?= tether
IMAGE_TAG ?= $(VERSION)
IMAGE_CONTEXT ?= bin/image
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt
DIST    ?= dist/$(VERSION)
GOARCH  ?= $(shell $(GO) env GOARCH)

.PHONY: help build run test lint fmt fuzz bench bench-compare scale e2e clean image image-context helm release

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

build: ## build bin/tether (static, trimmed)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/tether ./cmd/tether

run: build ## run the demo: server, client and stand-in backends on loopback
	bin/tether demo

test: helm ## run every test with the race detector (unit and end-to-end)
	HELM=$(HELM) $(GO) test -race -shuffle=on -timeout 30m ./...

e2e: ## run only the end-to-end tests
	$(GO) test -race -timeout 30m ./test/...

lint: $(GOLANGCI) ## golangci-lint (.golangci.yml) and module tidiness
	$(GOLANGCI) run ./...
	$(GO) mod tidy -diff

$(GOLANGCI): # installed once, at the pinned version
	GOBIN=$(GOBIN) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

helm: ## install the pinned helm into GOBIN for the chart tests and make release (built once, then reused)
	@if $(GO) version -m $(HELM) 2>/dev/null | grep -Eq '^[[:space:]]+mod[[:space:]]+helm.sh/helm/v3[[:space:]]+$(HELM_VERSION)([[:space:]]|$$)' && \
		$(GO) version -m $(HELM) | grep -q 'chartutil.k8sVersionMinor=$(HELM_KUBE_MINOR)'; then \
		echo "helm $(HELM_VERSION) is at $(HELM)"; \
	else \
		echo "building helm $(HELM_VERSION) into $(GOBIN) (once; a few minutes)"; \
		GOBIN=$(GOBIN) $(GO) install -ldflags '$(HELM_LDFLAGS)' helm.sh/helm/v3/cmd/helm@$(HELM_VERSION); \
	fi

image: image-context ## build the container image IMAGE:IMAGE_TAG (tether:git describe) with docker, podman or buildah
	deploy/image.sh $(IMAGE_CONTEXT) Dockerfile $(IMAGE):$(IMAGE_TAG) $(VERSION)

image-context: # stage the image's build context: static binary, CA bundle, nonroot user
	@test -r $(CA_BUNDLE) || { echo "image: no CA bundle at $(CA_BUNDLE): install ca-certificates (apt-get install ca-certificates) or set CA_BUNDLE=FILE" >&2; exit 1; }
	rm -rf $(IMAGE_CONTEXT)
	mkdir -p $(IMAGE_CONTEXT)/etc/ssl/certs
	CGO_ENABLED=0 GOOS=linux GOARCH=$(GOARCH) $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(IMAGE_CONTEXT)/tether ./cmd/tether
	cp $(CA_BUNDLE) $(IMAGE_CONTEXT)/etc/ssl/certs/ca-certificates.crt
	printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > $(IMAGE_CONTEXT)/etc/passwd
	printf 'root:x:0:\nnonroot:x:65532:\n' > $(IMAGE_CONTEXT)/etc/group

release: helm ## VERSION=vX.Y.Z: binaries for linux/amd64 and arm64, SHA256SUMS, SBOM, charts and a multi-arch image archive in DIST (dist/VERSION)
	GO=$(GO) HELM=$(HELM) deploy/release.sh $(VERSION) $(DIST)

fmt: ## format the code
	gofmt -w $$(git ls-files '*.go')

fuzz: ## run each fuzz target for FUZZTIME (default 10s)
	$(GO) test -run '^$$' -fuzz '^FuzzVerify$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s ./auth/
	$(GO) test -run '^$$' -fuzz '^FuzzApply$$' -fuzztime $(FUZZTIME) ./internal/config/
	$(GO) test -run '^$$' -fuzz '^FuzzParseRoute$$' -fuzztime $(FUZZTIME) ./proxy/
	$(GO) test -run '^$$' -fuzz '^FuzzRoutePath$$' -fuzztime $(FUZZTIME) ./proxy/
	$(GO) test -run '^$$' -fuzz '^FuzzHeadScanner$$' -fuzztime $(FUZZTIME) ./proxy/
	$(GO) test -run '^$$' -fuzz '^FuzzUpstreamAnswer$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 10s ./proxy/
	$(GO) test -run '^$$' -fuzz '^FuzzDialRequest$$' -fuzztime $(FUZZTIME) ./tunnel/
	$(GO) test -run '^$$' -fuzz '^FuzzDialReply$$' -fuzztime $(FUZZTIME) ./tunnel/
	$(GO) test -run '^$$' -fuzz '^FuzzReadOpening$$' -fuzztime $(FUZZTIME) ./tunnel/server/gate/
	$(GO) test -run '^$$' -fuzz '^FuzzHeadLines$$' -fuzztime $(FUZZTIME) ./tunnel/server/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodePayload$$' -fuzztime $(FUZZTIME) ./tunnel/server/buffer/

bench: ## Go benchmarks of the request path (see also bench-compare)
	$(GO) test -run '^$$' -bench . -skip '^BenchmarkIdleSessions$$' -benchmem ./tunnel/server/ ./tunnel/server/registry/ ./tunnel/server/buffer/ ./proxy/ ./auth/

scale: build ## idle sessions at scale: SCALE_SESSIONS (20000: 10,000 tunnels x 2) against bin/tether; server RSS, heap, goroutines, idle CPU over SCALE_IDLE
	ulimit -n $$(ulimit -Hn) && TETHER_BIN=$(CURDIR)/bin/tether $(GO) test -run '^$$' -bench '^BenchmarkIdleSessions$$' \
		-benchtime $(SCALE_SESSIONS)x -timeout 60m ./tunnel/server/ -args -scale.idle $(SCALE_IDLE)

bench-compare: build ## BENCHMARKS.md: tether beside no tunnel, frp, chisel (~30 min; BENCH_FLAGS=-q: quick)
	bench/compare.sh $(BENCH_FLAGS)

clean: ## remove build output
	rm -rf bin dist
