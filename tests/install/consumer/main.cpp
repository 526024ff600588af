// Uses the installed library the way an application would: the umbrella header, a tensor, a
// conversion, and a kernel compiled by the JIT from the installed headers (include/dsk/kernels).
// Prints "consumer ok" and exits 0 when everything works.
#include <cstdio>
#include <filesystem>
#include <string>

#include <dsk/dsk.hpp>
#include <dsk/kernels/examples/scaled_rowsum.hpp>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::filesystem::path prefix = std::filesystem::canonical(argv[1]);

  dsk::Tensor x = dsk::Tensor::empty({4, 8}, dsk::DType::f32);
  float* p = x.data<float>();
  for (int i = 0; i < 32; ++i) p[i] = 0.25f * static_cast<float>(i) - 3.0f;
  dsk::Tensor y = dsk::Tensor::empty({4, 8}, dsk::DType::bf16);
  dsk::convert_f32_to_bf16(p, y.data<dsk::bf16>(), 32);
  for (int i = 0; i < 32; ++i)
    if (dsk::bf16_to_f32(y.data<dsk::bf16>()[i]) != p[i]) return 1;

  // The JIT must find the kernel headers in the installed tree, not in the source tree.
  const dsk::jit::KernelSource source = dsk::jit::tile_example_kernel(dsk::Backend::generic, 8);
  const std::filesystem::path root = dsk::jit::cache_key(source).include_root;
  if (std::filesystem::canonical(root).string().rfind(prefix.string(), 0) != 0) {
    std::printf("the JIT uses headers from %s, not from the install prefix %s\n", root.c_str(),
                prefix.c_str());
    return 1;
  }
  namespace ex = dsk::kernels::examples;
  const auto kernel = dsk::jit::get<ex::ScaledRowsumArgs>(
      source, &ex::scaled_rowsum<dsk::tile::generic_t, ex::ScaledRowsumConfig{}>);
  if (kernel.provider() != dsk::jit::Provider::jit) return 1;
  const float scale[4] = {1.0f, 2.0f, -1.0f, 0.5f};
  float sums[4];
  kernel({y.data<dsk::bf16>(), scale, sums, 4, 8, 8});
  for (int r = 0; r < 4; ++r) {
    float expected = 0;
    for (int c = 0; c < 8; ++c) expected += p[r * 8 + c];
    if (sums[r] != expected * scale[r]) return 1;  // small integers and quarters: exact
  }
  std::printf("consumer ok: dsk %s, backend %s, kernels from %s\n",
              std::string(dsk::build_info().version).c_str(),
              std::string(dsk::backend_name(dsk::backend())).c_str(), root.c_str());
  return 0;
}
