// The "tk" module of `dsk bench` / `dsk verify`: dsk::tk's routing (against a straightforward
// std::partial_sort gate, the peer of the >= 5x target), its memory-bound ops timed against the
// DRAM roof on cold data and the L2 roof on hot data (peer: a plain scalar loop where one is
// short to write), and verify cases against dsk::ref::tk on fresh random data.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

#include <fmt/format.h>

#include <dsk/core/threads.hpp>
#include <dsk/kernels/quant.hpp>
#include <dsk/ref.hpp>
#include <dsk/tk.hpp>

#include "bench/harness.hpp"

namespace dsk::bench {
namespace {

using tk::QuantTensor;

// ---- data ----

Tensor uniform_f32(const Shape& shape, uint64_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::f32);
  fill_uniform(t.data<float>(), static_cast<size_t>(t.numel()), seed);
  if (scale != 1.0f)
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] *= scale;
  return t;
}

Tensor uniform_bf16(const Shape& shape, uint64_t seed) {
  const Tensor f = uniform_f32(shape, seed);
  Tensor t = Tensor::empty(shape, DType::bf16);
  convert_f32_to_bf16(f.data<float>(), t.data<bf16>(), static_cast<size_t>(t.numel()));
  return t;
}

// Routing ids with about one -1 in ten.
Tensor routing_ids(int64_t tokens, int k, int experts, uint64_t seed) {
  Tensor idx = ref::randint({tokens, k}, DType::i64, seed, -(experts / 9) - 1, experts);
  for (int64_t i = 0; i < idx.numel(); ++i)
    idx.data<int64_t>()[i] = std::max<int64_t>(idx.data<int64_t>()[i], -1);
  return idx;
}

std::string shape_text(std::initializer_list<int64_t> dims) {
  return fmt::format("{}", fmt::join(dims, "x"));
}

// One bench case over `copies` inputs made by make_input(copy); kernel(input) is timed.
template <class Input>
BenchCase memory_case(std::string name, std::string shape, double bytes, bool cold, bool quick,
                      std::function<Input(int)> make_input,
                      std::function<void(const Input&)> kernel,
                      std::function<void(const Input&)> peer = {}, std::string peer_name = "") {
  return {.name = std::move(name),
          .shape = std::move(shape),
          .ceiling = cold ? "dram_read" : "l2_read",
          .peer = peer ? std::move(peer_name) : std::string(),
          .residency = cold ? Residency::cold : Residency::hot,
          .working_set_bytes = static_cast<size_t>(bytes),
          .quick = quick,
          .prepare = [=](const CaseContext& ctx) {
            auto inputs = std::make_shared<std::vector<Input>>();
            for (int c = 0; c < ctx.copies; ++c) inputs->push_back(make_input(c));
            Prepared p;
            p.kernel = [=](int c) { kernel((*inputs)[c]); };
            if (peer) p.peer = [=](int c) { peer((*inputs)[c]); };
            p.bytes = bytes;
            return p;
          }};
}

// ---- peers ----

// The gate as a user without dsk writes it: per token, std::exp sigmoids, std::partial_sort for
// each group's top 2, the top groups and the top experts (DeepSeek-V3 inference/model.py).
void partial_sort_gate(const float* logits, const float* bias, int64_t tokens, int experts,
                       int groups, int topk_groups, int topk, float scale, int64_t* idx,
                       float* weights) {
  parallel_for(tokens, [&](int64_t t0, int64_t t1, int) {
    const int per = experts / groups;
    std::vector<float> s(experts), b(experts), tmp(per);
    std::vector<std::pair<float, int>> group_scores(groups), candidates;
    for (int64_t t = t0; t < t1; ++t) {
      for (int e = 0; e < experts; ++e) {
        s[e] = 1.0f / (1.0f + std::exp(-logits[t * experts + e]));
        b[e] = s[e] + bias[e];
      }
      for (int g = 0; g < groups; ++g) {
        std::copy(b.begin() + g * per, b.begin() + (g + 1) * per, tmp.begin());
        std::partial_sort(tmp.begin(), tmp.begin() + 2, tmp.end(), std::greater<>());
        group_scores[g] = {tmp[0] + tmp[1], g};
      }
      const auto better = [](const std::pair<float, int>& x, const std::pair<float, int>& y) {
        return x.first > y.first || (x.first == y.first && x.second < y.second);
      };
      std::partial_sort(group_scores.begin(), group_scores.begin() + topk_groups,
                        group_scores.end(), better);
      candidates.clear();
      for (int j = 0; j < topk_groups; ++j)
        for (int e = group_scores[j].second * per; e < (group_scores[j].second + 1) * per; ++e)
          candidates.emplace_back(b[e], e);
      std::partial_sort(candidates.begin(), candidates.begin() + topk, candidates.end(), better);
      float sum = 1e-20f;
      for (int j = 0; j < topk; ++j) sum += s[candidates[j].second];
      for (int j = 0; j < topk; ++j) {
        idx[t * topk + j] = candidates[j].second;
        weights[t * topk + j] = s[candidates[j].second] / sum * scale;
      }
    }
  });
}

// per_token_cast to e4m3 with UE8M0 scales as a plain loop over the shared rules.
void scalar_per_token_cast(const Tensor& x, e4m3* out, float* sf) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const bf16* in = x.data<bf16>();
  parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t b = 0; b < cols; b += 128) {
        float amax = 0.0f;
        for (int64_t c = b; c < b + 128; ++c)
          amax = std::max(amax, std::fabs(numeric::bf16_to_f32(in[r * cols + c])));
        const float s = quant::block_scale(amax, numeric::kE4m3Max, true);
        sf[r * (cols / 128) + b / 128] = s;
        const float inv = quant::inverse_scale(s);
        for (int64_t c = b; c < b + 128; ++c)
          out[r * cols + c] = quant::quantize_e4m3(numeric::bf16_to_f32(in[r * cols + c]), inv);
      }
  });
}

// RMSNorm as a plain loop (f32 math, bf16 out).
void scalar_rms_norm(const Tensor& x, const Tensor& w, bf16* out) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const bf16* in = x.data<bf16>();
  const float* weight = w.data<float>();
  parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      float ss = 0.0f;
      for (int64_t c = 0; c < cols; ++c) {
        const float v = numeric::bf16_to_f32(in[r * cols + c]);
        ss += v * v;
      }
      const float rstd = 1.0f / std::sqrt(ss / cols + 1e-6f);
      for (int64_t c = 0; c < cols; ++c)
        out[r * cols + c] =
            numeric::f32_to_bf16(numeric::bf16_to_f32(in[r * cols + c]) * rstd * weight[c]);
    }
  });
}

// ---- bench cases ----

struct GateInput {
  Tensor logits, bias, idx, weights;
};

// DeepSeek-V3's gate.
constexpr int kExperts = 256, kTopk = 8, kGroups = 8, kTopkGroups = 4;

BenchCase gate_case(int64_t tokens, bool quick) {
  return {.name = "noaux_tc_gate",
          .shape = fmt::format("T={} E={} k={} groups={}/{}", tokens, kExperts, kTopk, kTopkGroups,
                               kGroups),
          .ceiling = "l2_read",
          .peer = "std::partial_sort",
          .residency = Residency::hot,
          .quick = quick,
          .prepare = [=](const CaseContext&) {
            auto in = std::make_shared<GateInput>();
            in->logits = uniform_f32({tokens, kExperts}, 17, 4.0f);
            in->bias = uniform_f32({kExperts}, 23, 0.1f);
            in->idx = Tensor::empty({tokens, kTopk}, DType::i64);
            in->weights = Tensor::empty({tokens, kTopk}, DType::f32);
            Prepared p;
            p.kernel = [in](int) {
              tk::noaux_tc_gate(in->logits, in->bias, kTopk, kGroups, kTopkGroups, 2.5f);
            };
            p.peer = [in, tokens](int) {
              partial_sort_gate(in->logits.data<float>(), in->bias.data<float>(), tokens, kExperts,
                                kGroups, kTopkGroups, kTopk, 2.5f, in->idx.data<int64_t>(),
                                in->weights.data<float>());
            };
            p.bytes = static_cast<double>(tokens) * (kExperts * 4 + kTopk * 12);
            return p;
          }};
}

void add_routing_benches(Registry& r) {
  r.add(gate_case(4096, true));
  r.add(gate_case(64, true));
  r.add(memory_case<Tensor>(
      "get_fused_mapping", "T=4096 k=8 E=256", 4096.0 * 8 * (8 + 16), false, true,
      [](int c) { return routing_ids(4096, 8, 256, 31 + c); },
      [](const Tensor& idx) { tk::get_fused_mapping(idx, 256, 0, 32); }));
}

struct CastInput {
  Tensor x;
  Tensor codes;  // scalar peer outputs
  Tensor sf;
};

void add_quant_benches(Registry& r) {
  for (auto [tokens, cold, quick] :
       {std::tuple{int64_t{4096}, true, true}, {int64_t{32}, false, true}}) {
    const int64_t hidden = 7168;
    const double bytes = static_cast<double>(tokens) * hidden * (2 + 1) + tokens * 56 * 4 / 4;
    r.add(memory_case<CastInput>(
        "per_token_cast", shape_text({tokens, hidden}) + " bf16->e4m3 ue8m0", bytes, cold, quick,
        [rows = tokens](int c) {  // clang 14 cannot capture structured bindings
          return CastInput{uniform_bf16({rows, hidden}, 41 + c),
                           Tensor::empty({rows, hidden}, DType::e4m3),
                           Tensor::empty({rows, hidden / 128}, DType::f32)};
        },
        [](const CastInput& in) { tk::per_token_cast(in.x, "e4m3", 128, true, true, true); },
        [](const CastInput& in) {
          scalar_per_token_cast(in.x, in.codes.data<e4m3>(), in.sf.data<float>());
        },
        "scalar loop"));
  }
  const int64_t rows = 4096, hidden = 7168;
  r.add(memory_case<Tensor>(
      "per_token_cast", shape_text({rows, hidden}) + " bf16->e2m1 g32", rows * hidden * 2.5, true,
      false,
      [=](int c) {
        return uniform_bf16({rows, hidden}, 43 + c);
      },
      [](const Tensor& x) { tk::per_token_cast(x, "e2m1", 32, true, true, true); }));
  r.add(memory_case<Tensor>(
      "per_block_cast", "7168x2048 bf16->e4m3 128x128", 7168 * 2048 * 3.0, true, false,
      [](int c) {
        return uniform_bf16({7168, 2048}, 47 + c);
      },
      [](const Tensor& x) {
        tk::per_block_cast(x, "e4m3", {128, 128});
      }));
  r.add(memory_case<QuantTensor>(
      "cast_back", shape_text({rows, hidden}) + " e4m3->bf16", rows * hidden * 3.0, true, false,
      [=](int c) {
        return tk::per_token_cast(uniform_bf16({rows, hidden}, 53 + c), "e4m3", 128);
      },
      [](const QuantTensor& q) {
        tk::cast_back(q, "bf16", {1, 128});
      }));
  const int64_t inter = 2048, expanded = 16384;
  r.add(memory_case<Tensor>(
      "swiglu_forward_and_per_token_cast",
      shape_text({expanded, 2 * inter}) + " bf16->e4m3 ue8m0 clamp", expanded * inter * 5.0, true,
      true,
      [=](int c) {
        return uniform_bf16({expanded, 2 * inter}, 59 + c);
      },
      [](const Tensor& x) {
        tk::swiglu_forward_and_per_token_cast(x, "e4m3", 128, std::nullopt, 10.0f, std::nullopt,
                                              std::nullopt, true, true, true);
      }));
  r.add(memory_case<Tensor>(
      "rmsnorm_forward_and_per_token_cast", shape_text({rows, hidden}) + " bf16->e4m3",
      rows * hidden * 3.0, true, true,
      [=](int c) {
        return uniform_bf16({rows, hidden}, 61 + c);
      },
      [w = uniform_f32({hidden}, 67)](const Tensor& x) {
        tk::rmsnorm_forward_and_per_token_cast(x, w, 1e-6f, "e4m3", 128, true, true, true);
      }));
}

struct NormInput {
  Tensor x, out;
};

void add_norm_benches(Registry& r) {
  const Tensor w = uniform_f32({7168}, 71);
  for (auto [tokens, cold] : {std::pair{int64_t{4096}, true}, {int64_t{32}, false}}) {
    const int64_t hidden = 7168;
    r.add(memory_case<NormInput>(
        "rms_norm", shape_text({tokens, hidden}) + " bf16", tokens * hidden * 4.0, cold, true,
        [rows = tokens](int c) {
          return NormInput{uniform_bf16({rows, hidden}, 73 + c),
                           Tensor::empty({rows, hidden}, DType::bf16)};
        },
        [w](const NormInput& in) { tk::rms_norm(in.x, w); },
        [w](const NormInput& in) { scalar_rms_norm(in.x, w, in.out.data<bf16>()); },
        "scalar loop"));
  }
  r.add(memory_case<Tensor>(
      "layer_norm", "262144x128 bf16 (indexer k)", 262144 * 128 * 4.0, true, false,
      [](int c) {
        return uniform_bf16({262144, 128}, 79 + c);
      },
      [w128 = uniform_f32({128}, 83)](const Tensor& x) { tk::layer_norm(x, w128, w128); }));
  const Tensor cache = tk::yarn_cos_sin_cache();
  r.add(memory_case<Tensor>(
      "apply_rotary", "4096x128x64 bf16 interleaved (MLA q_pe)", 4096 * 128 * 64 * 4.0, true, true,
      [](int c) {
        return uniform_bf16({4096, 128, 64}, 89 + c);
      },
      [cache](const Tensor& q) { tk::apply_rotary(q, cache, std::nullopt, std::nullopt, true); }));
  r.add(memory_case<Tensor>(
      "hadamard_transform", "4096x64x128 bf16 (indexer q)", 4096 * 64 * 128 * 4.0, true, true,
      [](int c) {
        return uniform_bf16({4096, 64, 128}, 97 + c);
      },
      [](const Tensor& x) { tk::hadamard_transform(x, 0.08838834764f); }));
}

struct CombineInput {
  Tensor x, y, weights;
  tk::FusedMapping m;
};

void add_mapping_benches(Registry& r) {
  const int64_t tokens = 4096, hidden = 2048;
  const auto make = [=](int c) {
    CombineInput in;
    in.m = tk::get_fused_mapping(routing_ids(tokens, 8, 256, 101 + c), 256, 0, 32);
    in.x = uniform_bf16({tokens, hidden}, 103 + c);
    in.y = uniform_bf16({in.m.pos_to_expert.size(0), hidden}, 107 + c);
    in.weights = uniform_f32({tokens, 8}, 109 + c);
    return in;
  };
  // Bytes: expanded rows written (about 8 per token) and token rows read. Bound by DRAM write:
  // 8.5 of the 9.5 bytes counted per value are written (non-temporal stores), and writes alone
  // ran slower than reads (the AMD Zen 5 VM: 37-40 GB/s against 55-58 on two threads).
  BenchCase expand = memory_case<CombineInput>(
      "expand_to_fused", shape_text({tokens, hidden}) + " bf16 k=8", tokens * hidden * 2.0 * 9.5,
      true, true, make, [](const CombineInput& in) {
        tk::expand_to_fused(in.x, in.m.token_topk_to_pos, in.m.pos_to_expert);
      });
  expand.ceiling = "dram_write";
  r.add(std::move(expand));
  r.add(memory_case<CombineInput>(
      "reduce_fused", shape_text({tokens, hidden}) + " bf16 k=8", tokens * hidden * 2.0 * 8.2, true,
      true, make,
      [](const CombineInput& in) { tk::reduce_fused(in.y, in.weights, in.m.token_topk_to_pos); }));
}

// ---- verify cases ----

uint64_t fresh_seed() {
  return fresh_rng()();
}

// Rows whose expert sets differ, among rows where the fp64 reference's last selected expert beats
// the first unselected one by more than f32 rounding can explain (1e-5).
double gate_mismatches(const tk::GateResult& got, const tk::GateResult& want, const Tensor& logits,
                       const Tensor& bias) {
  const Tensor s = ref::tk::gate_scores(logits, "sigmoid");
  double bad = 0;
  for (int64_t t = 0; t < logits.size(0); ++t) {
    std::vector<int64_t> a, b;
    for (int64_t j = 0; j < got.topk_idx.size(1); ++j) {
      a.push_back(got.topk_idx.at<int64_t>({t, j}));
      b.push_back(want.topk_idx.at<int64_t>({t, j}));
    }
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a == b) continue;
    // Ambiguous rows: a swapped expert within 1e-5 of the reference's choice.
    double worst_gap = 1e30;
    for (size_t j = 0; j < a.size(); ++j)
      if (!std::binary_search(b.begin(), b.end(), a[j]))
        for (int64_t e : b)
          worst_gap =
              std::min(worst_gap, std::fabs((s.at<double>({t, e}) + bias.at<float>({e})) -
                                            (s.at<double>({t, a[j]}) + bias.at<float>({a[j]}))));
    bad += worst_gap > 1e-5;
  }
  return bad;
}

void add_verify_cases(Registry& r) {
  r.add(VerifyCase{.name = "noaux_tc_gate",
                   .shape = "T=4096 E=256 k=8 groups=4/8",
                   .metric = "mismatched rows",
                   .tolerance = 0,
                   .run = [](const CaseContext&) {
                     const uint64_t seed = fresh_seed();
                     const Tensor logits = ref::randn({4096, 256}, DType::f32, seed);
                     const Tensor bias = ref::randn({256}, DType::f32, seed + 1, 0.0f, 0.1f);
                     return gate_mismatches(tk::noaux_tc_gate(logits, bias, 8, 8, 4, 2.5f),
                                            ref::tk::noaux_tc_gate(logits, bias, 8, 8, 4, 2.5f),
                                            logits, bias);
                   }});
  r.add(VerifyCase{.name = "topk_gate",
                   .shape = "T=1024 E=384 k=16",
                   .metric = "mismatches",
                   .tolerance = 0,
                   .run = [](const CaseContext&) {
                     const Tensor s = ref::randn({1024, 384}, DType::f32, fresh_seed());
                     return mismatches(tk::topk_gate(s, 16), ref::tk::topk_gate(s, 16));
                   }});
  r.add(VerifyCase{.name = "get_fused_mapping",
                   .shape = "T=4096 k=8 E=256",
                   .metric = "mismatches",
                   .tolerance = 0,
                   .run = [](const CaseContext&) {
                     const Tensor idx = routing_ids(4096, 8, 256, fresh_seed());
                     const tk::FusedMapping a = tk::get_fused_mapping(idx, 256, 0, 32);
                     const tk::FusedMapping b = ref::tk::get_fused_mapping(idx, 256, 32);
                     return mismatches(a.pos_to_expert, b.pos_to_expert) +
                            mismatches(a.token_topk_to_pos, b.token_topk_to_pos) +
                            mismatches(a.expert_start, b.expert_start);
                   }});
  r.add(VerifyCase{.name = "reduce_fused",
                   .shape = "T=512 k=8 hidden=2048 f32",
                   .metric = "calc_diff",
                   .tolerance = 1e-12,
                   .run = [](const CaseContext&) {
                     const uint64_t seed = fresh_seed();
                     const tk::FusedMapping m =
                         tk::get_fused_mapping(routing_ids(512, 8, 64, seed), 64, 0, 32);
                     const Tensor y = ref::randn({m.pos_to_expert.size(0), 2048}, DType::f32, seed);
                     const Tensor w = ref::rand_uniform({512, 8}, DType::f32, seed + 1);
                     return ref::calc_diff(tk::reduce_fused(y, w, m.token_topk_to_pos),
                                           ref::tk::reduce_fused(y, w, m.token_topk_to_pos));
                   }});
  for (std::string_view fmt : {"e4m3", "e2m1"})
    r.add(VerifyCase{.name = fmt::format("per_token_cast_{}", fmt),
                     .shape = "512x7168 bf16 ue8m0",
                     .metric = "mismatches",
                     .tolerance = 0,
                     .run = [fmt](const CaseContext&) {
                       const int g = fmt == "e4m3" ? 128 : 32;
                       const Tensor x = ref::randn({512, 7168}, DType::bf16, fresh_seed());
                       const QuantTensor got = tk::per_token_cast(x, fmt, g, true, true, true);
                       const QuantTensor want = ref::tk::per_token_cast(x, fmt, g, true);
                       return mismatches(got.data, want.data) +
                              mismatches(ref::tk::unpack_scales(got.sf, 512, 7168 / g), want.sf);
                     }});
  r.add(VerifyCase{.name = "per_block_cast",
                   .shape = "1024x2048 bf16 128x128",
                   .metric = "mismatches",
                   .tolerance = 0,
                   .run = [](const CaseContext&) {
                     const Tensor x = ref::randn({1024, 2048}, DType::bf16, fresh_seed());
                     const QuantTensor got = tk::per_block_cast(x, "e4m3", {128, 128});
                     const QuantTensor want = ref::tk::per_block_cast(x, "e4m3", {128, 128});
                     return mismatches(got.data, want.data) + mismatches(got.sf, want.sf);
                   }});
  r.add(VerifyCase{.name = "swiglu_forward_and_per_token_cast",
                   .shape = "1024x2x2048 bf16 clamp 10",
                   .metric = "calc_diff",
                   .tolerance = 1e-3,
                   .run = [](const CaseContext&) {
                     const Tensor x = ref::randn({1024, 4096}, DType::bf16, fresh_seed());
                     const QuantTensor q =
                         tk::swiglu_forward_and_per_token_cast(x, "e4m3", 128, std::nullopt, 10.0f);
                     return ref::calc_diff(tk::cast_back(q, "fp32", {1, 128}),
                                           ref::tk::swiglu_forward(x, std::nullopt, 10.0f));
                   }});
  r.add(VerifyCase{
      .name = "rmsnorm_forward_and_per_token_cast",
      .shape = "512x7168 bf16",
      .metric = "calc_diff",
      .tolerance = 1e-3,
      .run = [](const CaseContext&) {
        const uint64_t seed = fresh_seed();
        const Tensor x = ref::randn({512, 7168}, DType::bf16, seed);
        const Tensor w = ref::randn({7168}, DType::f32, seed + 1, 1.0f, 0.1f);
        const QuantTensor q = tk::rmsnorm_forward_and_per_token_cast(x, w, 1e-6f, "e4m3", 128);
        return ref::calc_diff(tk::cast_back(q, "fp32", {1, 128}), ref::tk::rms_norm(x, w));
      }});
  r.add(VerifyCase{.name = "rms_norm",
                   .shape = "512x7168 bf16->f32",
                   .metric = "calc_diff",
                   .tolerance = 1e-12,
                   .run = [](const CaseContext&) {
                     const uint64_t seed = fresh_seed();
                     const Tensor x = ref::randn({512, 7168}, DType::bf16, seed);
                     const Tensor w = ref::randn({7168}, DType::f32, seed + 1);
                     return ref::calc_diff(tk::rms_norm(x, w, 1e-6f, DType::f32),
                                           ref::tk::rms_norm(x, w));
                   }});
  r.add(VerifyCase{.name = "layer_norm",
                   .shape = "4096x128 f32",
                   .metric = "calc_diff",
                   .tolerance = 1e-12,
                   .run = [](const CaseContext&) {
                     const uint64_t seed = fresh_seed();
                     const Tensor x = ref::randn({4096, 128}, DType::f32, seed);
                     const Tensor w = ref::randn({128}, DType::f32, seed + 1);
                     return ref::calc_diff(tk::layer_norm(x, w, w), ref::tk::layer_norm(x, w, w));
                   }});
  for (bool interleaved : {true, false})
    r.add(VerifyCase{.name = interleaved ? "apply_rotary_interleaved" : "apply_rotary_half",
                     .shape = "256x64x64 f32, random positions",
                     .metric = "calc_diff",
                     .tolerance = 1e-12,
                     .run = [interleaved](const CaseContext&) {
                       const uint64_t seed = fresh_seed();
                       const Tensor cache = tk::yarn_cos_sin_cache();
                       const Tensor x = ref::randn({256, 64, 64}, DType::f32, seed);
                       const Tensor pos = ref::randint({256}, DType::i32, seed + 1, 0, 16384);
                       Tensor q = x.clone();
                       tk::apply_rotary(q, cache, std::nullopt, pos, interleaved);
                       return ref::calc_diff(q, ref::tk::apply_rotary(x, cache, pos, interleaved));
                     }});
  r.add(VerifyCase{.name = "hadamard_transform",
                   .shape = "1024x128 f32",
                   .metric = "calc_diff",
                   .tolerance = 1e-12,
                   .run = [](const CaseContext&) {
                     const Tensor x = ref::randn({1024, 128}, DType::f32, fresh_seed());
                     return ref::calc_diff(tk::hadamard_transform(x, 0.08838834764f),
                                           ref::tk::hadamard_transform(x, 0.08838834764));
                   }});
}

}  // namespace

void register_tk_cases(Registry& r) {
  add_routing_benches(r);
  add_quant_benches(r);
  add_norm_benches(r);
  add_mapping_benches(r);
  add_verify_cases(r);
}

}  // namespace dsk::bench
