# Compiler flags shared by every target, and the per-ISA flags of kernel translation units.
#
# The library itself is built for baseline x86-64 so it runs on any CPU; translation units whose
# name ends in _avx512.cpp or _amx.cpp get the ISA flags below (dsk_isa_sources), and the backend
# is chosen at run time from CPUID. JIT-compiled kernels use -march=native instead.

set(DSK_WARNING_FLAGS -Wall -Wextra)

# NOTES: g++ contracts a*b+c into an FMA by default in C++ (and clang within one expression).
# Contraction changes rounding, so the backends could not be bitwise identical to each other and
# to dsk::ref. Kernels that want an FMA ask for it explicitly (std::fma, _mm512_fmadd_ps).
add_compile_options(-ffp-contract=off)
if(DSK_WERROR)
  list(APPEND DSK_WARNING_FLAGS -Werror)
endif()

set(DSK_AVX512_FLAGS -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512cd
                     -mavx512bf16 -mavx512vnni -mavx512vbmi)
set(DSK_AMX_FLAGS ${DSK_AVX512_FLAGS} -mamx-tile -mamx-bf16 -mamx-int8)
# *_avx2.cpp: the portable (generic_t) code of a kernel compiled for AVX2 hosts without the
# avx512 backend (AMD Zen 2/3, Intel before Sapphire Rapids); -ffp-contract=off keeps its bits
# those of the baseline build.
set(DSK_AVX2_FLAGS -mavx2 -mfma -mf16c)  # what dsk::cpu_features() checks before using them
# The same flags, space-separated, for the JIT (src/jit/compiler.cpp): an avx512 or amx kernel is
# compiled with its ISA's flags on top of -march=native, so it builds on any x86-64 host.
string(JOIN " " DSK_JIT_AVX512_FLAGS ${DSK_AVX512_FLAGS})
string(JOIN " " DSK_JIT_AMX_FLAGS ${DSK_AMX_FLAGS})

set(DSK_SANITIZER_FLAGS "")
if(DSK_SANITIZE STREQUAL "address")
  set(DSK_SANITIZER_FLAGS -fsanitize=address -fno-omit-frame-pointer)
elseif(DSK_SANITIZE STREQUAL "undefined")
  set(DSK_SANITIZER_FLAGS -fsanitize=undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
elseif(DSK_SANITIZE STREQUAL "address,undefined")
  set(DSK_SANITIZER_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
elseif(DSK_SANITIZE STREQUAL "thread")
  set(DSK_SANITIZER_FLAGS -fsanitize=thread)
elseif(NOT DSK_SANITIZE STREQUAL "")
  message(FATAL_ERROR "DSK_SANITIZE must be empty, address, undefined, address,undefined or thread, not '${DSK_SANITIZE}'")
endif()
add_compile_options(${DSK_SANITIZER_FLAGS})
add_link_options(${DSK_SANITIZER_FLAGS})

# NOTES: the portable kernels (*_generic.cpp) are 16-lane loops over small arrays, and
# AddressSanitizer's use-after-scope instrumentation of every such temporary makes g++ 12 take
# more than 20 minutes for src/tk/kernels_generic.cpp alone (under 2 minutes without it). Those
# translation units keep every other ASan check.
set(DSK_GENERIC_KERNEL_FLAGS "")
if(DSK_SANITIZE MATCHES "address")
  set(DSK_GENERIC_KERNEL_FLAGS -fno-sanitize-address-use-after-scope)
endif()

# dsk_isa_sources(<out-var> <sources...>): gives every *_avx2.cpp / *_avx512.cpp / *_amx.cpp its
# ISA flags (and *_generic.cpp the flags above), and sets <out-var> to the sources with the ISA
# files last.
# NOTES: an inline function or template the library does not put in its DSK_TILE_ABI namespace
# (std::mt19937_64::_M_gen_rand, std::vector's members, a test helper) is compiled in every
# translation unit that uses it, AVX-512 ones included, and the linker keeps the first copy in
# link order. Baseline files first make that copy the baseline one, so it cannot raise SIGILL on
# a CPU without AVX-512 (seen: a generic test died in an AVX-512 mt19937_64 on an AMD Zen 3).
function(dsk_isa_sources out)
  set(baseline "")
  set(isa "")
  foreach(src IN LISTS ARGN)
    if(src MATCHES "_amx\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${DSK_AMX_FLAGS}")
      list(APPEND isa ${src})
    elseif(src MATCHES "_avx512\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${DSK_AVX512_FLAGS}")
      list(APPEND isa ${src})
    elseif(src MATCHES "_avx2\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${DSK_AVX2_FLAGS}")
      list(APPEND isa ${src})
    else()
      if(src MATCHES "_generic\\.cpp$" AND DSK_GENERIC_KERNEL_FLAGS)
        set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${DSK_GENERIC_KERNEL_FLAGS}")
      endif()
      list(APPEND baseline ${src})
    endif()
  endforeach()
  set(${out} ${baseline} ${isa} PARENT_SCOPE)
endfunction()

# The flags the library is built with, as `dsk env` reports them.
string(TOUPPER "${CMAKE_BUILD_TYPE}" _dsk_bt)
string(JOIN " " DSK_EFFECTIVE_CXX_FLAGS ${CMAKE_CXX_FLAGS} ${CMAKE_CXX_FLAGS_${_dsk_bt}} -std=c++20 -ffp-contract=off
       ${DSK_WARNING_FLAGS} ${DSK_SANITIZER_FLAGS})
