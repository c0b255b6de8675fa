#!/usr/bin/env bash
# Checks that the tools and headers a make target needs are installed, before a build would fail deep in a
# header. `make test` and `make train` call it first; run it by hand the same way:
#
#   bash scripts/deps.sh NEED...     NEED: cxx make eigen doctest stb pcre2 curl nvcc cublas
#
# All present: silent, exit 0. Something missing: on Debian/Ubuntu as root it installs the missing packages with
# apt-get (as .ci/run does) and checks again; otherwise it prints what is missing and the one command that
# installs it, and exits 1. DEPS_INSTALL=no never installs (the tests use it). The CUDA toolkit (nvcc, cuBLAS)
# has no such command: it says where to get it.
# The places looked in are the Makefile's: CXX, EIGEN_INC, DOCTEST_INC, STB_INC and NVCC from the environment
# (make passes them), with the Makefile's defaults.
set -uo pipefail

CXX=${CXX:-g++}
EIGEN_INC=${EIGEN_INC:-/usr/include/eigen3}
DOCTEST_INC=${DOCTEST_INC:-}
STB_INC=${STB_INC:-/usr/include/stb}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
compiler=${CXX%% *}  # "ccache g++" runs ccache first

# have NEED: true when it is installed (each check takes milliseconds: a file test or one preprocessor run)
have() {
  case "$1" in
    cxx) command -v "$compiler" >/dev/null ;;
    make) command -v make >/dev/null ;;
    eigen) [[ -f "$EIGEN_INC/Eigen/Core" ]] ;;
    stb) [[ -f "$STB_INC/stb_image_write.h" && -f "$STB_INC/stb_image.h" ]] ;;
    doctest) echo '#include <doctest/doctest.h>' | $CXX -E -x c++ ${DOCTEST_INC:+-isystem "$DOCTEST_INC"} - >/dev/null 2>&1 ;;
    pcre2) printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <pcre2.h>\nint main() { return pcre2_config(0, 0) < -100; }\n' |
             $CXX -x c++ - -lpcre2-8 -o /dev/null >/dev/null 2>&1 ;;
    curl) command -v curl >/dev/null ;;
    nvcc) [[ -x "$NVCC" ]] ;;
    cublas) local home; home=$(dirname "$(dirname "$NVCC")")
            [[ -f "$home/include/cublas_v2.h" && -f "$home/include/cublasLt.h" ]] &&
              compgen -G "$home/lib*/libcublasLt.so*" >/dev/null ;;
  esac
}

# what NEED is called, and its Debian/Ubuntu package ("" when apt has none)
describe() {
  case "$1" in
    cxx) echo "a C++17 compiler ($compiler)|g++" ;;
    make) echo "make|make" ;;
    eigen) echo "Eigen 3 ($EIGEN_INC/Eigen/Core)|libeigen3-dev" ;;
    stb) echo "stb ($STB_INC/stb_image_write.h)|libstb-dev" ;;
    doctest) echo "doctest (doctest/doctest.h)|doctest-dev" ;;
    pcre2) echo "PCRE2 (pcre2.h, -lpcre2-8)|libpcre2-dev" ;;
    curl) echo "curl (to download the data sources)|curl" ;;
    nvcc) echo "the CUDA compiler ($NVCC)|" ;;
    cublas) echo "cuBLAS and cuBLASLt (in the CUDA toolkit beside $NVCC)|" ;;
  esac
}

missing() {
  local n
  for n in "$@"; do have "$n" || echo "$n"; done
}

needs=("$@")
(( ${#needs[@]} )) || { echo "usage: bash scripts/deps.sh NEED... (cxx make eigen doctest stb pcre2 curl nvcc cublas)" >&2; exit 2; }
for n in "${needs[@]}"; do
  [[ -n "$(describe "$n")" ]] || { echo "scripts/deps.sh: unknown need '$n' (cxx make eigen doctest stb pcre2 curl nvcc cublas)" >&2; exit 2; }
done
lost=($(missing "${needs[@]}"))
(( ${#lost[@]} )) || exit 0

# packages NEED...: the Debian/Ubuntu packages of the given needs (the CUDA toolkit has none)
packages() {
  local n d
  for n in "$@"; do d=$(describe "$n"); [[ -n "${d##*|}" ]] && echo "${d##*|}"; done
}

debian=0
grep -qiE '^(ID|ID_LIKE)=.*(debian|ubuntu)' /etc/os-release 2>/dev/null && debian=1
pkgs=($(packages "${lost[@]}"))
if (( ${#pkgs[@]} && debian )) && [[ $(id -u) == 0 && "${DEPS_INSTALL:-yes}" != no ]] && command -v apt-get >/dev/null; then
  echo "installing what is missing: ${pkgs[*]} (apt-get, as root)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
  lost=($(missing "${needs[@]}"))
  (( ${#lost[@]} )) || exit 0
  pkgs=($(packages "${lost[@]}"))
fi

names=()
for n in "${lost[@]}"; do d=$(describe "$n"); names+=("${d%%|*}"); done
echo "error: missing: $(IFS=';'; echo "${names[*]}" | sed 's/;/; /g')" >&2
if (( ${#pkgs[@]} )); then
  if (( debian )); then
    echo "  install with: sudo apt-get install -y ${pkgs[*]}" >&2
  else
    echo "  install them with your system's package manager (on Debian/Ubuntu: sudo apt-get install -y ${pkgs[*]})" >&2
  fi
fi
if (( ${#pkgs[@]} < ${#lost[@]} )); then
  echo "  the CUDA toolkit (nvcc, cuBLAS): https://developer.nvidia.com/cuda-downloads; put its bin/ on PATH or give NVCC=/path/to/nvcc" >&2
fi
exit 1
