// The whole public API of DSKernels: #include <dsk/dsk.hpp> and link dsk::dsk.
#pragma once

#include <dsk/core.hpp>
#include <dsk/ep.hpp>
#include <dsk/gemm.hpp>
#include <dsk/jit.hpp>
#include <dsk/mla.hpp>
#include <dsk/ref.hpp>
#include <dsk/select.hpp>
#include <dsk/tk.hpp>
