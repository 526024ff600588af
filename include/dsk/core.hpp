// dsk core: types, tensors, errors, environment, CPU features, threads, timing.
#pragma once

#include <dsk/core/check.hpp>
#include <dsk/core/cpu.hpp>
#include <dsk/core/dtype.hpp>
#include <dsk/core/env.hpp>
#include <dsk/core/error.hpp>
#include <dsk/core/tensor.hpp>
#include <dsk/core/threads.hpp>
#include <dsk/core/timer.hpp>
#include <dsk/core/version.hpp>
