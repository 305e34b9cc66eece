#!/usr/bin/env bash
# One-time, idempotent set-up of a fresh machine: Debian's Arm toolchain and QEMU, and a
# virtual environment in .venv with Corten and its pinned dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v arm-none-eabi-gcc >/dev/null || need_apt+=(gcc-arm-none-eabi)
[ -e /usr/lib/arm-none-eabi/newlib/librdimon.a ] || need_apt+=(libnewlib-arm-none-eabi)
command -v qemu-system-arm >/dev/null || need_apt+=(qemu-system-arm)
command -v gcc >/dev/null || need_apt+=(gcc)
command -v make >/dev/null || need_apt+=(make)
command -v clang >/dev/null || need_apt+=(clang)  # strict-warning builds of the generated C (tests)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "== apt-get install ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.corten-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ scripts/setup.sh -nt "$stamp" ]; then
  echo "== pip install (torch pinned to 2.13.0, the CPU build)"
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q torch==2.13.0 torchao==0.18.0 numpy pytest pytest-xdist pytest-randomly hypothesis matplotlib scikit-learn
  .venv/bin/pip install -q ai-edge-litert tflite flatbuffers onnx   # model files (.tflite, .onnx) and LiteRT's reference
  .venv/bin/pip install -q --no-deps onnx2torch                      # (its torchvision dependency would replace torch)
  .venv/bin/pip install -q -e . --no-deps
  touch "$stamp"
fi
