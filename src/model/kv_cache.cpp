// The paged KV cache of dsk::model (kv_cache.hpp).
#include "model/kv_cache.hpp"

#include <string>

#include <dsk/core/check.hpp>

namespace dsk::model {

namespace km = kernels::mla;

KvCache::KvCache(int num_layers, int64_t num_pages) : num_pages_(num_pages) {
  constexpr const char* fn = "model::KvCache";
  DSK_CHECK_ARG(num_layers >= 1, fn, "num_layers", ">= 1", num_layers);
  DSK_CHECK_ARG(num_pages >= 1 && num_pages < (int64_t{1} << 31) / kPageTokens, fn, "num_pages",
                "in [1, 2^31 / 64)", num_pages);
  for (int l = 0; l < num_layers; ++l) {
    mla_.push_back(Tensor::empty({num_pages, kPageTokens, 1, km::kTokenBytes}, DType::u8));
    indexer_.push_back(
        Tensor::empty({num_pages, kPageTokens, 1, km::kIndexerTokenBytes}, DType::u8));
  }
  for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

int64_t KvCache::page_bytes(int num_layers) {
  return int64_t{num_layers} * kPageTokens * (km::kTokenBytes + km::kIndexerTokenBytes);
}

int64_t KvCache::add_sequence() {
  const int64_t id = next_seq_++;
  seqs_[id] = Sequence{};
  return id;
}

const KvCache::Sequence& KvCache::sequence(int64_t seq) const {
  const auto it = seqs_.find(seq);
  DSK_CHECK_ARG(it != seqs_.end(), "model::KvCache", "seq", "a live sequence id", seq);
  return it->second;
}

void KvCache::free_sequence(int64_t seq) {
  const Sequence& s = sequence(seq);
  for (auto b = s.blocks.rbegin(); b != s.blocks.rend(); ++b) free_.push_back(*b);
  seqs_.erase(seq);
}

int64_t KvCache::length(int64_t seq) const {
  return sequence(seq).length;
}

const std::vector<int32_t>& KvCache::blocks(int64_t seq) const {
  return sequence(seq).blocks;
}

int64_t KvCache::pages_needed(int64_t seq, int64_t new_length) const {
  const int64_t have = static_cast<int64_t>(sequence(seq).blocks.size());
  const int64_t need = (new_length + kPageTokens - 1) / kPageTokens;
  return need > have ? need - have : 0;
}

void KvCache::grow(int64_t seq, int64_t new_length) {
  const int64_t extra = pages_needed(seq, new_length);
  DSK_CHECK(extra <= free_pages(), "model::KvCache",
            std::to_string(extra) + " pages needed, " + std::to_string(free_pages()) + " free");
  Sequence& s = seqs_.at(seq);
  for (int64_t i = 0; i < extra; ++i) {
    s.blocks.push_back(free_.back());
    free_.pop_back();
  }
  s.length = new_length;
}

int32_t KvCache::block_of(int64_t seq, int64_t pos) const {
  const Sequence& s = sequence(seq);
  DSK_CHECK(pos >= 0 && pos < s.length, "model::KvCache",
            "position " + std::to_string(pos) + " outside a sequence of " +
                std::to_string(s.length) + " tokens");
  return s.blocks[static_cast<size_t>(pos / kPageTokens)];
}

uint8_t* KvCache::mla_token(int layer, int64_t seq, int64_t pos) const {
  const int64_t slot = int64_t{block_of(seq, pos)} * kPageTokens + pos % kPageTokens;
  return static_cast<uint8_t*>(mla_pages(layer).data_ptr()) + slot * km::kTokenBytes;
}

uint8_t* KvCache::indexer_codes(int layer, int64_t seq, int64_t pos) const {
  uint8_t* block = static_cast<uint8_t*>(indexer_pages(layer).data_ptr()) +
                   int64_t{block_of(seq, pos)} * km::indexer_block_bytes(kPageTokens);
  return block + km::indexer_codes_offset(pos % kPageTokens);
}

float* KvCache::indexer_scale(int layer, int64_t seq, int64_t pos) const {
  uint8_t* block = static_cast<uint8_t*>(indexer_pages(layer).data_ptr()) +
                   int64_t{block_of(seq, pos)} * km::indexer_block_bytes(kPageTokens);
  return reinterpret_cast<float*>(block + km::indexer_scale_offset(pos % kPageTokens, kPageTokens));
}

}  // namespace dsk::model
