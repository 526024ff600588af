// The model's paged KV cache: per layer one pool of MLA pages (64 tokens of 656 bytes, the sparse
// decode kernel's k_cache) and one of indexer pages (64 tokens of 132 bytes in DeepGEMM's paged
// layout), one block allocator shared by all layers (a sequence's block b is page b in every
// layer's pools), and per-sequence block tables.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include <dsk/core/tensor.hpp>
#include <dsk/kernels/mla/kv_format.hpp>

namespace dsk::model {

inline constexpr int64_t kPageTokens = 64;  // V3.2 deployments' page_block_size

class KvCache {
 public:
  KvCache(int num_layers, int64_t num_pages);

  int64_t add_sequence();
  void free_sequence(int64_t seq);
  bool has_sequence(int64_t seq) const { return seqs_.count(seq) != 0; }
  int64_t length(int64_t seq) const;
  const std::vector<int32_t>& blocks(int64_t seq) const;
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_pages() const { return num_pages_; }

  // Pages seq needs beyond its own to hold new_length tokens.
  int64_t pages_needed(int64_t seq, int64_t new_length) const;
  // Takes those pages (the caller checked there are enough) and sets the length.
  void grow(int64_t seq, int64_t new_length);

  // uint8 [num_pages, 64, 1, 656]: flash_mla_with_kvcache's FP8 k_cache.
  const Tensor& mla_pages(int layer) const { return mla_[static_cast<size_t>(layer)]; }
  // uint8 [num_pages, 64, 1, 132]: fp8_paged_mqa_logits's kv_cache.
  const Tensor& indexer_pages(int layer) const { return indexer_[static_cast<size_t>(layer)]; }
  // Where token `pos` of seq lies: its 656 bytes, its indexer codes (128) and scale (f32).
  uint8_t* mla_token(int layer, int64_t seq, int64_t pos) const;
  uint8_t* indexer_codes(int layer, int64_t seq, int64_t pos) const;
  float* indexer_scale(int layer, int64_t seq, int64_t pos) const;
  // Bytes of one page in all layers (both pools).
  static int64_t page_bytes(int num_layers);

 private:
  struct Sequence {
    int64_t length = 0;
    std::vector<int32_t> blocks;
  };
  const Sequence& sequence(int64_t seq) const;
  int32_t block_of(int64_t seq, int64_t pos) const;

  int64_t num_pages_;
  std::vector<Tensor> mla_, indexer_;
  std::vector<int32_t> free_;  // a stack: the lowest page ids are handed out first
  std::map<int64_t, Sequence> seqs_;
  int64_t next_seq_ = 0;
};

}  // namespace dsk::model
