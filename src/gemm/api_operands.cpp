// Operands, outputs and the trivial cases of dsk::gemm's API layer (see api_internal.hpp).
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include <dsk/core/check.hpp>

#include "gemm/api_internal.hpp"

namespace dsk::gemm::api {
namespace {

// Whether no two rows of a batched [G, M, N] output (stride 1 in N) share an element: the
// dimension of the smaller stride steps over whole rows, the other over all of it. This covers a
// contiguous batch and a transposed view such as [M, G, N].transpose(0, 1).
bool groups_disjoint(const Tensor& d) {
  struct Dim {
    int64_t size, stride;
  };
  Dim inner{d.size(0), d.stride(0)}, outer{d.size(1), d.stride(1)};
  if (inner.size > 1 && (outer.size <= 1 || inner.stride > outer.stride)) std::swap(inner, outer);
  if (inner.size <= 1) inner = {1, d.size(2)};
  if (outer.size <= 1) return inner.stride >= d.size(2);
  return inner.stride >= d.size(2) && outer.stride >= inner.size * inner.stride;
}

uint8_t fp4_nibble(const uint8_t* byte, int index) {
  return index == 0 ? (*byte & 0xF) : (*byte >> 4);
}

}  // namespace

// ---- operands ----

OperandInfo parse_operand(const char* fn, const char* arg, const Tensor& t, int dims,
                          std::initializer_list<DType> dtypes) {
  check::dtype_in(fn, arg, t, dtypes);
  check::dim(fn, arg, t, dims);
  // A batch may have any group stride: each group's rows are read at their own base (a view such
  // as [T, G, K].transpose(0, 1) is read in place, where upstream needs a contiguous copy).
  OperandInfo op;
  op.data = t;
  // Upstream's major rule; a dimension of size 1 may carry any stride.
  if (t.stride(-1) == 1) {
    op.major = Major::k;
  } else if (t.stride(-2) == 1) {
    op.major = Major::mn;
  } else if (t.size(-1) == 1) {
    op.major = Major::k;
  } else {
    DSK_CHECK_ARG(t.size(-2) == 1, fn, arg,
                  "stride 1 in one of the last two dimensions (K-major or MN-major)", t.describe());
    op.major = Major::mn;
  }
  op.groups = dims == 3 ? t.size(0) : 1;
  op.mn = t.size(-2);
  op.k = t.size(-1);
  if (t.dtype() == DType::fp4x2) (op.major == Major::k ? op.k : op.mn) *= 2;
  return op;
}

void require_k_major(const char* fn, const char* arg, const OperandInfo& op) {
  DSK_CHECK_ARG(op.major == Major::k, fn, arg, "a K-major operand (stride 1 in the last dimension)",
                op.data.describe());
}

OperandInfo to_k_major(const char* fn, const char* arg, const OperandInfo& op) {
  if (op.dtype() != DType::fp4x2 || op.major == Major::k) return op;
  DSK_CHECK_ARG(op.k % 2 == 0, fn, arg, "an even K for an MN-major FP4 operand", op.k);
  const bool batched = op.data.dim() == 3;
  Shape shape = {op.mn, op.k / 2};
  if (batched) shape.insert(shape.begin(), op.groups);
  Tensor out = Tensor::empty(shape, DType::fp4x2);
  const auto* src = static_cast<const uint8_t*>(op.data.data_ptr());
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  const int64_t s_pair = op.data.stride(-2), s_k = op.data.stride(-1);
  for (int64_t g = 0; g < op.groups; ++g) {
    const uint8_t* in = src + (batched ? g * op.data.stride(0) : 0);
    uint8_t* o = dst + g * op.mn * (op.k / 2);
    // Value (r, kk) is nibble r % 2 of input byte (r / 2, kk); output byte (r, q) holds the values
    // (r, 2q) and (r, 2q + 1).
    for (int64_t r = 0; r < op.mn; ++r)
      for (int64_t q = 0; q < op.k / 2; ++q) {
        const uint8_t* byte0 = in + (r / 2) * s_pair + (2 * q) * s_k;
        const uint8_t* byte1 = in + (r / 2) * s_pair + (2 * q + 1) * s_k;
        const auto lo = fp4_nibble(byte0, static_cast<int>(r % 2));
        const auto hi = fp4_nibble(byte1, static_cast<int>(r % 2));
        o[r * (op.k / 2) + q] = static_cast<uint8_t>(lo | (hi << 4));
      }
  }
  OperandInfo k_major = op;
  k_major.data = out;
  k_major.major = Major::k;
  return k_major;
}

engine::Operand engine_operand(const OperandInfo& op, int64_t group, int64_t r0, int64_t r1) {
  const Tensor& t = op.data;
  const auto es = static_cast<int64_t>(t.element_size());
  const char* base = static_cast<const char*>(t.data_ptr());
  if (t.dim() == 3) base += group * t.stride(0) * es;
  engine::Operand o;
  o.dtype = t.dtype();
  o.rows = r1 - r0;
  o.k = op.k;
  o.stride_r = t.stride(-2);
  // fp4x2 is K-major here (to_k_major ran): stride_k counts bytes, i.e. pairs of values.
  o.stride_k = t.dtype() == DType::fp4x2 ? 1 : t.stride(-1);
  o.data = base + r0 * o.stride_r * es;
  return o;
}

// ---- outputs ----

void check_output(const char* fn, const char* arg, const Tensor& d, int dims,
                  std::initializer_list<DType> dtypes) {
  check::dtype_in(fn, arg, d, dtypes);
  check::dim(fn, arg, d, dims);
  DSK_CHECK_ARG(d.stride(-1) == 1 || d.size(-1) <= 1, fn, arg,
                "a row-major (N-major) tensor: stride 1 in the last dimension", d.describe());
  DSK_CHECK_ARG(d.size(-2) <= 1 || d.stride(-2) >= d.size(-1), fn, arg,
                "rows that do not overlap (stride(-2) >= size(-1))", d.describe());
  if (dims == 3)
    DSK_CHECK_ARG(groups_disjoint(d), fn, arg,
                  "groups whose rows do not overlap (the smaller of stride(0) and stride(1) at "
                  "least size(2), the larger spanning the other dimension)",
                  d.describe());
}

engine::Output engine_output(const Tensor& d, int64_t group, int64_t r0, int64_t r1) {
  const auto es = static_cast<int64_t>(d.element_size());
  char* base = static_cast<char*>(d.data_ptr());
  if (d.dim() == 3) base += group * d.stride(0) * es;
  engine::Output o;
  o.dtype = d.dtype();
  o.m = r1 - r0;
  o.n = d.size(-1);
  o.ld = d.size(-2) > 1 ? d.stride(-2) : d.size(-1);
  o.data = base + r0 * d.stride(-2) * es;
  return o;
}

bool early_return(const char* fn, int64_t m, int64_t n, int64_t k, const Tensor& d,
                  const std::optional<Tensor>& c) {
  bool c_is_d = false;
  if (c.has_value()) {
    check::dtype(fn, "c", *c, d.dtype());
    DSK_CHECK_ARG(c->sizes() == d.sizes(), fn, "c", "the shape of d " + d.describe(),
                  c->describe());
    DSK_CHECK_ARG(c->stride(-1) == 1 || c->size(-1) <= 1, fn, "c",
                  "a row-major (N-major) tensor: stride 1 in the last dimension", c->describe());
    c_is_d = c->data_ptr() == d.data_ptr();
    if (c_is_d)
      DSK_CHECK_ARG(c->strides() == d.strides(), fn, "c", "the strides of d when c is d",
                    c->describe());
    else
      DSK_CHECK_ARG(!c->may_overlap(d), fn, "c", "d itself or a tensor that does not overlap d",
                    "a tensor partially overlapping d");
  }
  if (m == 0 || n == 0) return true;
  Tensor out = d;  // a handle: copy_ and fill_bytes_ write through it
  if (k == 0) {
    if (!c_is_d) c.has_value() ? out.copy_(*c) : out.fill_bytes_(0);
    return true;
  }
  if (c.has_value() && !c_is_d) out.copy_(*c);
  return false;
}

void check_compiled_dims(const char* fn, std::string_view compiled_dims) {
  std::string seen;
  for (char ch : compiled_dims) {
    const bool ok = (ch == 'm' || ch == 'n' || ch == 'k') && seen.find(ch) == std::string::npos;
    DSK_CHECK_ARG(ok, fn, "compiled_dims", "distinct letters from \"mnk\"",
                  fmt::format("\"{}\"", compiled_dims));
    seen.push_back(ch);
  }
}

// ---- weights ----

std::shared_ptr<const engine::PackedB> pack_group(const OperandInfo& b,
                                                  const std::optional<ScaleInfo>& sfb,
                                                  int64_t group) {
  engine::Operand operand = engine_operand(b, group, 0, b.mn);
  CanonicalScales scales;  // kept alive until pack_b has copied them
  if (sfb.has_value()) {
    scales = canonical_scales(*sfb, group, 0, b.mn);
    operand.sf = scales.view;
  }
  return engine::pack_b(operand);
}

void check_packed_weight(const char* fn, const PackedWeight& b, bool fp8_family,
                         std::optional<int64_t> groups, int64_t k) {
  DSK_CHECK_ARG(b.defined(), fn, "b", "a weight made by pack_weight", "an empty PackedWeight");
  const bool fp8 = b.dtype() == DType::e4m3 || b.dtype() == DType::fp4x2;
  DSK_CHECK_ARG(fp8 == fp8_family, fn, "b",
                fp8_family ? "an FP8 or FP4 packed weight" : "a BF16 packed weight",
                fmt::format("a {} packed weight", dtype_name(b.dtype())));
  if (groups.has_value())
    DSK_CHECK_ARG(b.num_groups() == *groups, fn, "b", fmt::format("{} groups", *groups),
                  b.num_groups());
  DSK_CHECK_ARG(b.k() == k, fn, "b", fmt::format("K = {} (the K of a)", k), b.k());
}

}  // namespace dsk::gemm::api
