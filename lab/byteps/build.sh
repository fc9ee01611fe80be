#!/usr/bin/env bash
# Build what the BytePS jobs of `make pcaps` run, from the BytePS sdist on PyPI (no upstream code is in this
# repository): bytedance/ps-lite (3rdparty/ps-lite of byteps==0.2.5.post15), our kv_app against it, and
# BytePS's own server without CUDA.
#
#   lab/byteps/build.sh BUILD_DIR            (PY: the python whose pip downloads the sdist; default python3)
#
# Into BUILD_DIR, each step skipped when its output is newer than its inputs (safe to run again):
#   dl/byteps-0.2.5.post15.tar.gz   pip download (sdist only, no dependencies), sha256-checked
#   src/byteps-0.2.5.post15/        the sdist unpacked
#   3rdparty/ps-lite/build/libps.a  `make ps DEPS_PATH=/usr`: against Debian's libzmq3-dev (4.3.4, ZMTP 3.1);
#                                   the ZMQ van only (no RDMA, UCX or fabric)
#   zmq414/                         the zeromq 4.1.4 the sdist ships (what BytePS's setup.py links, ZMTP 3.0),
#                                   static, and a second libps.a built against it
#   bin/kv_app, bin/kv_app-zmq414   lab/byteps/kv_app.cc against either libps.a
#   bin/byteps_server[-zmq414]      byteps/server of the sdist, compiled as setup.py's build_server() does
#                                   (its sources, flags and -DBYTEPS_BUILDING_SERVER), run by byteps_server_main.cc
#   bin/meta_layout                 RawMeta / RawNode offsets as g++ lays out this ps-lite's src/meta.h
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=$(mkdir -p "${1:?usage: build.sh BUILD_DIR}" && cd "$1" && pwd)
PY=${PY:-python3}
JOBS=${JOBS:-$(nproc)}
VERSION=0.2.5.post15
SDIST_SHA256=9d6a3c5be4c4b5a172739744bb32725c433f9a9f63794e1885e7376ff4eea99f
SDIST=$BUILD/dl/byteps-$VERSION.tar.gz
SRC=$BUILD/src/byteps-$VERSION
PSLITE=$SRC/3rdparty/ps-lite
ZMQ414=$BUILD/zmq414

# out-of-date OUTPUT INPUT...: OUTPUT is missing or older than one of the inputs
out_of_date() {
  local output=$1 input
  shift
  [ -e "$output" ] || return 0
  for input in "$@"; do
    [ "$input" -nt "$output" ] && return 0
  done
  return 1
}

if [ ! -f "$SDIST" ] || ! echo "$SDIST_SHA256  $SDIST" | sha256sum -c --quiet - 2>/dev/null; then
  rm -f "$SDIST"
  "$PY" -m pip download --quiet "byteps==$VERSION" --no-deps --no-binary :all: -d "$BUILD/dl"
  echo "$SDIST_SHA256  $SDIST" | sha256sum -c --quiet -
fi
if out_of_date "$PSLITE/Makefile" "$SDIST"; then
  rm -rf "$SRC"
  mkdir -p "$BUILD/src"
  tar -xzf "$SDIST" -C "$BUILD/src"
  touch "$PSLITE/Makefile"
fi

# ps-lite's Makefile: build/*.o depend on $(DEPS_PATH)/include/zmq.h, which Debian provides; nothing downloaded.
make -s -C "$PSLITE" -j"$JOBS" ps DEPS_PATH=/usr USE_RDMA=0 USE_UCX=0 USE_FABRIC=0

# The sdist's zeromq 4.1.4, configured as ps-lite's make/deps.mk does.
if [ ! -f "$ZMQ414/lib/libzmq.a" ]; then
  rm -rf "$BUILD/zeromq-4.1.4"
  tar -xzf "$SRC/zeromq-4.1.4.tar.gz" -C "$BUILD"
  (cd "$BUILD/zeromq-4.1.4" && CFLAGS=-fPIC CXXFLAGS=-fPIC ./configure --prefix="$ZMQ414" --with-libsodium=no \
     --with-libgssapi_krb5=no --enable-static --disable-shared >/dev/null \
   && make -s -j"$JOBS" >/dev/null && make -s install >/dev/null)
  rm -rf "$BUILD/zeromq-4.1.4"
fi
# ps-lite's Makefile writes build/ inside its source: the second libps.a is compiled with the Makefile's flags
# into zmq414/, from the source directory as the Makefile does (its logs then name "src/van.cc", not our path).
for unit in customer postoffice van; do
  if out_of_date "$ZMQ414/$unit.o" "$PSLITE/src/$unit.cc"; then
    (cd "$PSLITE" && g++ -std=c++14 -msse2 -fPIC -O3 -ggdb -Wall -finline-functions -Isrc -Iinclude \
       -I"$ZMQ414/include" -c "src/$unit.cc" -o "$ZMQ414/$unit.o")
  fi
done
if out_of_date "$ZMQ414/libps.a" "$ZMQ414"/{customer,postoffice,van}.o; then
  rm -f "$ZMQ414/libps.a"
  ar crs "$ZMQ414/libps.a" "$ZMQ414"/{customer,postoffice,van}.o
fi

mkdir -p "$BUILD/bin"
APP_FLAGS=(-std=c++14 -O2 -g -Wall -pthread -I"$PSLITE/include")
if out_of_date "$BUILD/bin/kv_app" "$HERE/kv_app.cc" "$PSLITE/build/libps.a"; then
  g++ "${APP_FLAGS[@]}" "$HERE/kv_app.cc" "$PSLITE/build/libps.a" -lzmq -lrt -o "$BUILD/bin/kv_app"
fi
if out_of_date "$BUILD/bin/kv_app-zmq414" "$HERE/kv_app.cc" "$ZMQ414/libps.a"; then
  g++ "${APP_FLAGS[@]}" "$HERE/kv_app.cc" "$ZMQ414/libps.a" "$ZMQ414/lib/libzmq.a" -lrt -o "$BUILD/bin/kv_app-zmq414"
fi
if out_of_date "$BUILD/bin/meta_layout" "$HERE/meta_layout.cc" "$PSLITE/src/meta.h"; then
  g++ -std=c++14 -I"$PSLITE/src" "$HERE/meta_layout.cc" -o "$BUILD/bin/meta_layout"
fi

# BytePS's server: setup.py get_cpp_flags() (the first set that compiles here) and get_common_options();
# byteps/common/common.h includes Python.h. -w instead of its -Wall: upstream's warnings are not ours to read.
PY_INCLUDE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
SERVER_FLAGS=(-std=c++11 -fPIC -Ofast -w -fopenmp -march=native -mno-avx512f -DEIGEN_MPL2_ONLY=1
              -DBYTEPS_BUILDING_SERVER -I3rdparty/ps-lite/include -I"$PY_INCLUDE")
SERVER_SOURCES=(server/server.cc common/cpu_reducer.cc common/logging.cc common/common.cc
                common/compressor/compressor_registry.cc common/compressor/error_feedback.cc
                common/compressor/impl/dithering.cc common/compressor/impl/onebit.cc
                common/compressor/impl/randomk.cc common/compressor/impl/topk.cc
                common/compressor/impl/vanilla_error_feedback.cc)
mkdir -p "$BUILD/byteps_server"
SERVER_OBJECTS=()
for source in "${SERVER_SOURCES[@]}"; do
  object=$BUILD/byteps_server/$(echo "$source" | tr / _ | sed 's/\.cc$/.o/')
  if out_of_date "$object" "$SRC/byteps/$source"; then
    (cd "$SRC" && g++ "${SERVER_FLAGS[@]}" -c "byteps/$source" -o "$object")   # as setup.py, from the sdist's top
  fi
  SERVER_OBJECTS+=("$object")
done
# setup.py links the server with no library of its own (rdmacm and ibverbs only where RDMA headers exist)
if out_of_date "$BUILD/bin/byteps_server" "$HERE/byteps_server_main.cc" "${SERVER_OBJECTS[@]}" "$PSLITE/build/libps.a"
then
  g++ -fopenmp -pthread "$HERE/byteps_server_main.cc" "${SERVER_OBJECTS[@]}" "$PSLITE/build/libps.a" -lzmq -lrt \
    -o "$BUILD/bin/byteps_server"
fi
if out_of_date "$BUILD/bin/byteps_server-zmq414" "$HERE/byteps_server_main.cc" "${SERVER_OBJECTS[@]}" \
     "$ZMQ414/libps.a"; then
  g++ -fopenmp -pthread "$HERE/byteps_server_main.cc" "${SERVER_OBJECTS[@]}" "$ZMQ414/libps.a" \
    "$ZMQ414/lib/libzmq.a" -lrt -o "$BUILD/bin/byteps_server-zmq414"
fi
echo "built in $BUILD/bin: $(cd "$BUILD/bin" && echo *)"
