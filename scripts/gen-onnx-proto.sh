#!/usr/bin/env bash
# Regenerates crates/onnx/src/onnx_proto.rs from crates/onnx/proto/onnx.proto with prost-build
# on a descriptor set compiled by protox (pure Rust: no protoc), in a throwaway cargo project,
# so that tenet's own build needs neither. Run it only when onnx.proto changes; commit both.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d "${TMPDIR:-/tmp}/tenet-onnxgen.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src" "$work/out"
cat > "$work/Cargo.toml" <<'TOML'
[package]
name = "onnxgen"
version = "0.1.0"
edition = "2021"
[dependencies]
prost-build = "=0.14.6"
protox = "0.9"
TOML
cat > "$work/src/main.rs" <<'RS'
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (proto, include, out) = (&args[1], &args[2], &args[3]);
    let fds = protox::compile([proto], [include]).expect("onnx.proto compiles");
    // onnx.proto's comments are indented prose that rustdoc would run as doctests.
    prost_build::Config::new().out_dir(out).disable_comments(["."]).compile_fds(fds).expect("code is generated");
}
RS
(cd "$work" && cargo run -q --release -- "$root/crates/onnx/proto/onnx.proto" "$root/crates/onnx/proto" "$work/out")
{
    echo '//! The messages of `proto/onnx.proto` (ONNX 1.23.2, IR version 13), generated once by'
    echo '//! `scripts/gen-onnx-proto.sh` (prost-build 0.14 on a descriptor set compiled by protox) and'
    echo '//! committed, so that building tenet needs no `protoc`. Never edited by hand: regenerate.'
    echo
    cat "$work/out/onnx.rs"
} > crates/onnx/src/onnx_proto.rs
rustfmt --edition 2024 crates/onnx/src/onnx_proto.rs
