# sonde: the two commands a newcomer needs are `make lab` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
TARGET := x86_64-unknown-linux-gnu
export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: setup build lab test static bench clean

setup:
	@scripts/setup

build: setup
	$(CARGO) build --release

# The main job on a built-in default: retransmissions of every kind in two
# namespaces, sonde's totals beside the kernel's MIB counters.
lab: build
	$(SUDO) ./target/release/sonde lab retrans

# The full test suite (privileged: runs real traffic in namespaces).
test: setup
	$(SUDO) env "PATH=$(PATH)" $(CARGO) test -- --test-threads=2
	$(SUDO) ./target/debug/sonde lab retrans --loss 3

# A fully static binary: libbpf, libelf, zlib and zstd linked in, crt-static.
static: setup
	LIBBPF_SYS_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu \
	  RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static -C link-arg=-lzstd" \
	  $(CARGO) build --release --features static --target $(TARGET)
	@file target/$(TARGET)/release/sonde
	@ls -l target/$(TARGET)/release/sonde

bench: build
	$(SUDO) bench/retrans/run

clean:
	$(CARGO) clean
