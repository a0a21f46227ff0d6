#!/usr/bin/env bash
# The python_binding_install ctest entry: `cmake --install` the python component into an empty
# prefix and import loom from there (from /, so the source and build trees are not on the path).
#
# usage: binding_install.sh CMAKE BUILD_DIR PREFIX INSTALL_DIR PYTHON
# (INSTALL_DIR is LOOM_PYTHON_INSTALL_DIR, relative to PREFIX; an absolute one points at a real
# site-packages, which a test must not write into, so the test then reports SKIP.)
set -euo pipefail
cmake="$1" build_dir="$2" prefix="$3" install_dir="$4" python="$5"
if [[ "$install_dir" = /* ]]; then
  echo "skipped: LOOM_PYTHON_INSTALL_DIR=$install_dir is absolute (installing would write there)"
  exit 77
fi
rm -rf "$prefix"
"$cmake" --install "$build_dir" --component python --prefix "$prefix" >/dev/null
site="$prefix/$install_dir"
ls "$site/loom/__init__.pyi" "$site/loom/nn/functional.pyi" "$site/loom/py.typed" >/dev/null
cd /
PYTHONPATH="$site" "$python" - "$site" <<'PY'
import sys
import loom
import loom.nn.functional as F
assert loom.__file__.startswith(sys.argv[1]), loom.__file__
assert F.relu(loom.tensor([-1.0, 2.0])).tolist() == [0.0, 2.0]
print("python_binding_install: imported", loom.__file__)
PY
