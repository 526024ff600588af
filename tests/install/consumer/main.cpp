// Uses the installed library the way an application would: the umbrella header, a tensor, a
// conversion and the backend choice. Exits 0 and prints "consumer ok" when everything works.
#include <cstdio>

#include <dsk/dsk.hpp>

int main() {
  dsk::Tensor x = dsk::Tensor::empty({4, 8}, dsk::DType::f32);
  float* p = x.data<float>();
  for (int i = 0; i < 32; ++i) p[i] = 0.25f * static_cast<float>(i) - 3.0f;
  dsk::Tensor y = dsk::Tensor::empty({4, 8}, dsk::DType::bf16);
  dsk::convert_f32_to_bf16(p, y.data<dsk::bf16>(), 32);
  for (int i = 0; i < 32; ++i)
    if (dsk::bf16_to_f32(y.data<dsk::bf16>()[i]) != p[i]) return 1;
  std::printf("consumer ok: dsk %s, backend %s\n", std::string(dsk::build_info().version).c_str(),
              std::string(dsk::backend_name(dsk::backend())).c_str());
  return 0;
}
