#!/usr/bin/env bash
# Every AVX-512 or AMX instruction in a binary must sit in a function of an ISA's DSK_TILE_ABI
# namespace (abi_avx512, abi_amx: dsk/kernels/abi.hpp), which only runs once dsk::backend() chose
# that ISA. Anything else (a std:: template or a helper compiled in an *_avx512.cpp file and kept
# by the linker for every caller) would raise SIGILL on a CPU without AVX-512.
# Usage: isa_hygiene.sh BINARY [ALLOWED_REGEX]; lists the offending functions and exits 1.
set -euo pipefail
binary=$1
allowed=${2:-'abi_avx512|abi_amx'}
# Operands and mnemonics that exist only with AVX-512 (EVEX) or AMX.
evex='%zmm|%k[0-7]|%[xy]mm(1[6-9]|2[0-9]|3[01])|\{1to[0-9]+\}|vpternlog|vpermt2|vpermi2|vprol|vpror|vpmov[dqw][bdw]|vpcompress|vpexpand|vscalef|vfixupimm|vrndscale|vgetexp|vgetmant|vcvtne2ps2bf16|vcvtneps2bf16|vdpbf16|vpdpbusd|vpdpwssd|vmovdqu(8|16|32|64)|vmovdqa(32|64)|vshuf[fi](32x4|64x2)|vinsert[fi](32x4|32x8|64x2|64x4)|vextract[fi](32x4|32x8|64x2|64x4)|valign[dq]|vpmullq|vpabsq|vpmax[su]q|vpmin[su]q|vpsraq|tdpb|tileload|tilestore|tilezero|ldtilecfg|tilerelease'
offenders=$(objdump -d --no-show-raw-insn "$binary" |
  awk -v re="$evex" '/^[0-9a-f]+ <.*>:$/ {fn = $2; next} $0 ~ re {print fn}' |
  sort -u | sed 's/^<//; s/>:$//' | c++filt | grep -Ev "$allowed" || true)
if [ -n "$offenders" ]; then
  echo "AVX-512/AMX instructions outside the ISA namespaces of $binary:"
  echo "$offenders"
  exit 1
fi
echo "ISA hygiene: $binary has AVX-512/AMX code only in ($allowed)"
