# sonde: the two commands a newcomer needs are `make lab` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
TARGET := x86_64-unknown-linux-gnu
export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: setup build lab lint deny deploy-check test static static-arm64 image vmtest bench docs install clean

setup:
	@scripts/setup

build: setup
	$(CARGO) build --release

# The main job on a built-in default: retransmissions of every kind in two
# namespaces, sonde's totals beside the kernel's MIB counters.
lab: build
	$(SUDO) ./target/release/sonde lab retrans

# Format and lints: rustfmt.toml, Cargo.toml [lints], .clang-format for the BPF C;
# licences (LICENSE, deny.toml) and the Kubernetes manifests (deploy/).
lint: setup
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings
	clang-format --dry-run -Werror $$(git ls-files '*.c' '*.h' | grep -v vmlinux.h)
	@$(MAKE) --no-print-directory deny deploy-check

# Licences of the BPF C files, and of every crate in the graph (deny.toml):
# also bans and sources. Advisories need the network: `cargo deny check advisories`.
deny:
	scripts/license-check
	$(CARGO) deny --locked check licenses bans sources

# deploy/*.yaml: strict schemas (kubernetes-validate, offline once installed
# in /tmp) and the least-privilege policy (deploy/policy.py).
deploy-check:
	deploy/check

# The full test suite (privileged: runs real traffic in namespaces).
# Seconds of the bounded ELF/perf-map fuzzer (tests/integration/hostile_elf.rs).
FUZZ_SECS ?= 120
test: setup lint
	$(SUDO) env "PATH=$(PATH)" SONDE_FUZZ_SECS=$(FUZZ_SECS) $(CARGO) test -- --test-threads=2
	$(SUDO) ./target/debug/sonde lab retrans --loss 3
	$(MAKE) static
	$(SUDO) scripts/static-check target/$(TARGET)/release/sonde
	$(MAKE) static-arm64
	$(SUDO) deploy/check-image
	$(SUDO) scripts/vmtest-both target/$(TARGET)/release/sonde target/$(ARM64)/release/sonde

# A fully static binary (static-pie): libbpf, libelf, zlib and zstd linked in,
# crt-static. GNU ld, not the rust-lld that rustc >= 1.90 uses by default:
# rust-lld links glibc's static-pie start-up wrongly (the binary jumps to its
# own load address from _init and segfaults before main).
static: setup
	LIBBPF_SYS_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu \
	  RUSTFLAGS="-C target-feature=+crt-static -C link-arg=-lzstd -C link-arg=-fuse-ld=bfd" \
	  $(CARGO) build --release --features static --target $(TARGET)
	@file target/$(TARGET)/release/sonde
	@ls -l target/$(TARGET)/release/sonde

# The same for arm64 (aarch64), built on an x86_64 host with Debian's cross
# compiler and arm64 libraries (scripts/setup installs them): BPF objects
# compiled against src/bpf/arm64/vmlinux.h, lab workloads built for arm64.
ARM64 = aarch64-unknown-linux-gnu
static-arm64: setup
	CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
	  CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar \
	  PKG_CONFIG_ALLOW_CROSS=1 PKG_CONFIG_PATH=/usr/lib/aarch64-linux-gnu/pkgconfig \
	  LIBBPF_SYS_LIBRARY_PATH_aarch64_unknown_linux_gnu=/usr/lib/aarch64-linux-gnu \
	  LIBBPF_SYS_LIBRARY_PATH_x86_64_unknown_linux_gnu=/usr/lib/x86_64-linux-gnu \
	  RUSTFLAGS="-C target-feature=+crt-static -C link-arg=-lzstd -C link-arg=-fuse-ld=bfd" \
	  $(CARGO) build --release --features static --target $(ARM64)
	@file target/$(ARM64)/release/sonde
	@ls -l target/$(ARM64)/release/sonde

# The container image (deploy/Containerfile, FROM scratch) of the static
# binaries, built offline: with podman or buildah a manifest list of an amd64
# and an arm64 image (about 20 MB each), with docker the amd64 one.
image: static static-arm64
	deploy/build-image

# Every bench/NAME/run (a new tool's bench needs no edit here).
bench: build
	set -e; for r in bench/*/run; do $(SUDO) $$r; done

# The static binary on Debian's 6.1 kernel under qemu (kprobes, fentry, no
# sched_exit_tp, tcp_retransmit_skb without err).
vmtest: static
	$(SUDO) scripts/vmtest target/$(TARGET)/release/sonde

# Man pages and shell completions, written from the flag definitions into
# docs/man and docs/completions (a test fails when they fall behind).
docs: build
	./target/release/sonde generate man docs/man
	./target/release/sonde generate bash docs/completions
	./target/release/sonde generate zsh docs/completions
	./target/release/sonde generate fish docs/completions

# The static binary, its man pages and completions under PREFIX (DESTDIR for
# packaging), written by the binary being installed.
PREFIX ?= /usr/local
install: static
	install -D -m 0755 target/$(TARGET)/release/sonde $(DESTDIR)$(PREFIX)/bin/sonde
	$(DESTDIR)$(PREFIX)/bin/sonde generate all $(DESTDIR)$(PREFIX)/share/sonde/generated
	install -d $(DESTDIR)$(PREFIX)/share/man/man1
	install -m 0644 $(DESTDIR)$(PREFIX)/share/sonde/generated/*.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -D -m 0644 $(DESTDIR)$(PREFIX)/share/sonde/generated/sonde.bash $(DESTDIR)$(PREFIX)/share/bash-completion/completions/sonde
	install -D -m 0644 $(DESTDIR)$(PREFIX)/share/sonde/generated/_sonde $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_sonde
	install -D -m 0644 $(DESTDIR)$(PREFIX)/share/sonde/generated/sonde.fish $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/sonde.fish
	rm -rf $(DESTDIR)$(PREFIX)/share/sonde/generated

clean:
	$(CARGO) clean
