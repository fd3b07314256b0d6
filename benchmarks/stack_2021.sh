#!/usr/bin/env bash
# Run a benchmark script on the software of spring 2021: Python 3.9.2 and PyTorch 1.8.1.
#
#   bash benchmarks/stack_2021.sh benchmarks/bench_host_loop.py
#
# The host-side costs of DeepSpeed's 2021 ZeRO-3 (docs/validation.md, section 1) ran on
# the Python and PyTorch of the time, not on today's. This script unpacks Debian 11's
# Python 3.9.2 (built February 2021) from deb.debian.org's pool without installing it,
# puts PyTorch 1.8.1 (March 2021) and NumPy 1.20.1 from PyPI beside it, and runs the
# given script with that interpreter. Nothing is installed system-wide; everything lies
# under $STACK_DIR (default: a folder in $TMPDIR). The PyTorch wheel is a CUDA 10.2
# build of ~800 MB; it runs on the CPU. The Python headers, distutils, setuptools 56 and
# ninja come too, so that a script can build a C++ extension (bench_copy_out.py does).
# x86_64 Linux only.
set -euo pipefail

script=${1:?usage: bash benchmarks/stack_2021.sh SCRIPT.py [ARGS...]}
shift
stack=${STACK_DIR:-${TMPDIR:-/tmp}/llmsim-stack-2021}
pool=http://deb.debian.org/debian/pool/main
debs=(
  p/python3.9/python3.9-minimal_3.9.2-1_amd64.deb
  p/python3.9/libpython3.9-minimal_3.9.2-1_amd64.deb
  p/python3.9/libpython3.9-stdlib_3.9.2-1_amd64.deb
  p/python3.9/libpython3.9-dev_3.9.2-1_amd64.deb
  p/python3.9/python3.9-dev_3.9.2-1_amd64.deb
  p/python3-stdlib-extensions/python3-distutils_3.9.2-1_all.deb
  libf/libffi/libffi7_3.3-6_amd64.deb
  o/openssl/libssl1.1_1.1.1w-0+deb11u1_amd64.deb
  m/mpdecimal/libmpdec3_2.5.1-1_amd64.deb
)

if [[ ! -x $stack/root/usr/bin/python3.9 ]]; then
  mkdir -p "$stack/debs" "$stack/root"
  for deb in "${debs[@]}"; do
    curl -fsSL -o "$stack/debs/${deb##*/}" "$pool/$deb"
    dpkg-deb -x "$stack/debs/${deb##*/}" "$stack/root"
  done
fi
if [[ ! -d $stack/site/torch ]]; then
  mkdir -p "$stack/wheels" "$stack/site"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.9 \
    --platform manylinux1_x86_64 --platform manylinux2014_x86_64 \
    torch==1.8.1 numpy==1.20.1 typing_extensions==3.7.4.3 setuptools==56.0.0 ninja==1.13.2 \
    -d "$stack/wheels"
  for wheel in "$stack"/wheels/*.whl; do
    python3 -m zipfile -e "$wheel" "$stack/site"
  done
  chmod +x "$stack"/site/ninja-*.data/scripts/ninja
fi

export LD_LIBRARY_PATH=$stack/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONHOME=$stack/root/usr PYTHONPATH=$stack/site
# Debian's pyconfig.h includes its multiarch copy from /usr/include; ninja for
# torch.utils.cpp_extension.
export CPATH=$stack/root/usr/include${CPATH:+:$CPATH}
PATH=$(echo "$stack"/site/ninja-*.data/scripts):$PATH
export PATH
exec "$stack/root/usr/bin/python3.9" "$script" "$@"
