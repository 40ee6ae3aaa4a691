#!/bin/sh
# Puts the .proto files ghz needs for envoy.service.ext_proc.v3 under
# ./protos (this script's folder), in three import roots:
#   protos/data-plane-api       envoy/...    (Envoy's API)
#   protos/xds                  udpa/... xds/... (CNCF xDS annotations)
#   protos/protoc-gen-validate  validate/... (field validation rules)
# google/protobuf/*.proto are built into ghz (and protoc).
#
# Source 1 (default): the envoy-types crate in cargo's registry, which
# carries exactly the protos kvpick's Rust types are generated from
# (`cargo fetch` in the workspace first).
# Source 2 (`./fetch-protos.sh git`): shallow clones of the upstream
# repositories (envoyproxy/data-plane-api, cncf/xds,
# bufbuild/protoc-gen-validate); newer than kvpick's types, but
# ext_proc v3 only ever grows compatibly.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out="$here/protos"
mkdir -p "$out"

if [ "${1:-crate}" = git ]; then
    tmp=$(mktemp -d)
    git clone --depth 1 https://github.com/envoyproxy/data-plane-api "$tmp/data-plane-api"
    git clone --depth 1 https://github.com/cncf/xds "$tmp/xds"
    git clone --depth 1 https://github.com/bufbuild/protoc-gen-validate "$tmp/protoc-gen-validate"
    rm -rf "$out/data-plane-api" "$out/xds" "$out/protoc-gen-validate"
    mkdir -p "$out/data-plane-api" "$out/xds" "$out/protoc-gen-validate"
    cp -R "$tmp/data-plane-api/envoy" "$out/data-plane-api/"
    cp -R "$tmp/xds/udpa" "$tmp/xds/xds" "$out/xds/"
    cp -R "$tmp/protoc-gen-validate/validate" "$out/protoc-gen-validate/"
    rm -rf "$tmp"
else
    registry="${CARGO_HOME:-$HOME/.cargo}/registry/src"
    crate=$(ls -d "$registry"/*/envoy-types-0.7.* 2>/dev/null | sort -V | tail -n 1)
    if [ -z "$crate" ]; then
        echo "envoy-types is not in $registry: run 'cargo fetch' in the kvpick workspace, or '$0 git'" >&2
        exit 1
    fi
    for root in data-plane-api xds protoc-gen-validate; do
        rm -rf "${out:?}/$root"
        cp -R "$crate/proto/$root" "$out/$root"
    done
fi
echo "protos in $out"
