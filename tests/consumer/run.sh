#!/usr/bin/env bash
# The "consumer" ctest entry: install the loom build into a private prefix, then configure,
# build and run tests/consumer against it with find_package(loom). Everything starts from empty
# directories so a header or config file the install forgot cannot be found from a stale copy.
#
# usage: run.sh CMAKE BUILD_DIR SOURCE_DIR GENERATOR CXX_COMPILER [extra cmake args for the consumer]
# (CMAKE is the cmake that configured the build, so the same version installs and configures.)
set -euo pipefail

cmake="$1"
build_dir="$2"
source_dir="$3"
generator="$4"
cxx="$5"
shift 5

prefix="$build_dir/consumer-prefix"
consumer_build="$build_dir/consumer-build"

echo "consumer: installing $build_dir into $prefix"
rm -rf "$prefix" "$consumer_build"
"$cmake" --install "$build_dir" --prefix "$prefix" >/dev/null

echo "consumer: configuring $source_dir/tests/consumer in $consumer_build"
"$cmake" -S "$source_dir/tests/consumer" -B "$consumer_build" -G "$generator" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON "$@" >/dev/null

echo "consumer: building"
"$cmake" --build "$consumer_build"

echo "consumer: running"
"$consumer_build/app"
