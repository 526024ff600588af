#!/usr/bin/env bash
# Every AVX-512 or AMX instruction in a binary must sit in a function of an ISA's DSK_TILE_ABI
# namespace (abi_avx512, abi_amx: dsk/kernels/abi.hpp), which only runs once dsk::backend() chose
# that ISA. Anything else (a std:: template or a helper compiled in an *_avx512.cpp file and kept
# by the linker for every caller) would raise SIGILL on a CPU without AVX-512.
# Usage: isa_hygiene.sh BINARY [ALLOWED_REGEX]; lists the offending functions and exits 1.
#        isa_hygiene.sh --startup BINARY...: only the code every run executes before main (static
#        initializers) is checked, for test programs whose ISA files hold test bodies
#        (tests/common/isa_test.hpp).
set -euo pipefail
# Operands and mnemonics that exist only with AVX-512 (EVEX) or AMX.
evex='%zmm|%k[0-7]|%[xy]mm(1[6-9]|2[0-9]|3[01])|\{1to[0-9]+\}|vpternlog|vpermt2|vpermi2|vprol|vpror|vpmov[dqw][bdw]|vpcompress|vpexpand|vscalef|vfixupimm|vrndscale|vgetexp|vgetmant|vcvtne2ps2bf16|vcvtneps2bf16|vdpbf16|vpdpbusd|vpdpwssd|vmovdqu(8|16|32|64)|vmovdqa(32|64)|vshuf[fi](32x4|64x2)|vinsert[fi](32x4|32x8|64x2|64x4)|vextract[fi](32x4|32x8|64x2|64x4)|valign[dq]|vpmullq|vpabsq|vpmax[su]q|vpmin[su]q|vpsraq|tdpb|tileload|tilestore|tilezero|ldtilecfg|tilerelease'

# The (mangled) names of the functions of $1 that hold such an instruction.
evex_functions() {
  objdump -d --no-show-raw-insn "$1" |
    awk -v re="$evex" '/^[0-9a-f]+ <.*>:$/ {fn = $2; next} $0 ~ re {print fn}' |
    sort -u | sed 's/^<//; s/>:$//'
}

if [ "$1" = "--startup" ]; then
  shift
  status=0
  for binary in "$@"; do
    # GCC's and Clang's names for a file's static initializers.
    offenders=$(evex_functions "$binary" |
      grep -E '^(_GLOBAL__sub_I_|_Z[0-9]+__static_initialization_and_destruction_|__cxx_global_var_init)' || true)
    if [ -n "$offenders" ]; then
      echo "AVX-512/AMX instructions in the startup code of $binary:"
      echo "$offenders"
      status=1
    fi
  done
  [ $status = 0 ] && echo "ISA hygiene: no AVX-512/AMX instruction runs before main in $*"
  exit $status
fi

binary=$1
allowed=${2:-'abi_avx512|abi_amx'}
# Only global and weak functions are checked: those are what the linker may hand to another
# file's callers (one kept copy of an inline template, a public function of an ISA file). A local
# one (static, unnamed namespace, a compiler's ".isra"/".constprop" clone) is reached only from its
# own file, whose functions are checked; a sanitizer build makes such clones of std::sort in both
# the generic and the avx512 top-k file, under one name.
only_local=$(comm -23 <(nm --defined-only "$binary" | awk '$2 == "t" {print $3}' | sort -u) \
                      <(nm --defined-only "$binary" | awk '$2 != "t" {print $3}' | sort -u))
offenders=$(comm -23 <(evex_functions "$binary" | sort -u) <(echo "$only_local") | c++filt |
  grep -Ev "$allowed" || true)
if [ -n "$offenders" ]; then
  echo "AVX-512/AMX instructions outside the ISA namespaces of $binary:"
  echo "$offenders"
  exit 1
fi
echo "ISA hygiene: $binary has AVX-512/AMX code only in ($allowed)"
