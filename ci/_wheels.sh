# Sourced, not run, by the commands meant for a GPU machine (ci/gpu-run, ci/test-kernels-gpu,
# ci/t4-rehearsal), from the repository root. Such a machine has torch but not the book's tool
# chain, and no network: install_wheels puts the wheels carried in .whl/ (ci/fetch-wheels) into
# /tmp/site and that folder first on PYTHONPATH.
#
#   install_wheels LOG [MODULE]   pip's output goes to LOG; with MODULE, nothing is installed when
#                                 that module is importable already. The interpreter: $PY, else python3.
install_wheels() {
  local log="$1" module="${2:-}" py="${PY:-python3}"
  compgen -G ".whl/*.whl" > /dev/null || return 0
  if [ -n "$module" ] && "$py" -c "import $module" 2> /dev/null; then
    return 0
  fi
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >> "$log" 2>&1 || echo "$(basename "$0"): wheel install failed (see $log)"
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
}
