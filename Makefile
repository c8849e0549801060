# tidemark — the two set-up commands are `make demo` and `make test`.
GO       ?= go
BIN      := bin/tidemark
PKGS     := ./...
# The race detector is on by default; RACE= turns it off.
RACE     ?= -race

.PHONY: all build demo test test-containers vet fmt-check bench soak clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/tidemark

# The main job on embedded defaults: a throwaway PostgreSQL (or DATABASE_URL),
# a mutating demo table, tidemark syncing it into the embedded broker, then
# the proof: the folded topic equals the table, next to what a naive OFFSET
# loop loses.
demo: build
	$(GO) run ./test/demo -tidemark $(BIN)

# Every test against a real PostgreSQL (throwaway cluster, or DATABASE_URL)
# and a Kafka-protocol broker (in-process kfake, or KAFKA_BROKERS). CI=true
# makes a test that finds no PostgreSQL fail instead of skipping
# (test/harness), so that `make test` never passes without one.
test: vet fmt-check
	CI=true $(GO) test $(RACE) -count=1 -timeout 20m $(PKGS)

# The integration and chaos suites against Apache Kafka (KRaft) and
# PostgreSQL in containers, through testcontainers-go (test/harness/containers.go).
# Needs a Docker engine and its image registry. Without an engine it says so
# and exits 2 before running anything (test/harness/enginecheck). Not in `test`.
test-containers:
	@$(GO) build -o bin/enginecheck ./test/harness/enginecheck
	@bin/enginecheck
	TIDEMARK_TEST_BACKEND=containers $(GO) test -count=1 -timeout 60m ./test/integration/... ./test/chaos/...

vet:
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

bench: build
	$(GO) run ./test/bench -tidemark $(BIN)

soak:
	TIDEMARK_SOAK=1 $(GO) test -count=1 -timeout 60m ./test/...

clean:
	rm -rf bin tidemark-data
