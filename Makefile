# tether: see README.md. `make help` lists the targets.

GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/tether-dev/tether/internal/version.Version=$(VERSION)
FUZZTIME ?= 10s
GOLANGCI_LINT_VERSION := v2.15.0
GOBIN   ?= $(shell $(GO) env GOPATH)/bin
GOLANGCI := $(GOBIN)/golangci-lint

.PHONY: help build run test lint fmt fuzz bench e2e clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'

build: ## build bin/tether (static, trimmed)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/tether ./cmd/tether

run: build ## run the demo: server, client and stand-in backends on loopback
	bin/tether demo

test: ## run every test with the race detector (unit and end-to-end)
	$(GO) test -race -shuffle=on -timeout 30m ./...

e2e: ## run only the end-to-end tests
	$(GO) test -race -timeout 30m ./test/...

lint: $(GOLANGCI) ## golangci-lint (.golangci.yml) and module tidiness
	$(GOLANGCI) run ./...
	$(GO) mod tidy -diff

$(GOLANGCI): # installed once, at the pinned version
	GOBIN=$(GOBIN) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

fmt: ## format the code
	gofmt -w $$(git ls-files '*.go')

fuzz: ## run each fuzz target for FUZZTIME (default 10s)
	$(GO) test -run '^$$' -fuzz '^FuzzVerify$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 2s ./auth/
	$(GO) test -run '^$$' -fuzz '^FuzzApply$$' -fuzztime $(FUZZTIME) ./internal/config/
	$(GO) test -run '^$$' -fuzz '^FuzzParseRoute$$' -fuzztime $(FUZZTIME) ./proxy/
	$(GO) test -run '^$$' -fuzz '^FuzzRoutePath$$' -fuzztime $(FUZZTIME) ./proxy/

bench: ## Go benchmarks of the request path (see also ../shared/bench)
	$(GO) test -run '^$$' -bench . -benchmem ./tunnel/server/ ./proxy/

clean: ## remove build output
	rm -rf bin
