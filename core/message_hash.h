// A 64-bit hash every process computes alike (absl::Hash is seeded per process), for checksums
// of messages between ranks and for comparing settings across ranks. One multiply and one
// xor-shift per 8-byte word, then a final avalanche (MurmurHash3's fmix64) with the length.
//
// Word-wise FNV-1a, which it replaces, let structured damage through: bit k of a word reaches
// only bits >= k of the state, so flipping bit 63 of two consecutive words cancelled exactly
// (tests/core/message_hash_test.cc checks this and single-bit, zero-extension and random damage).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace dcp {

class MessageHash64 {
 public:
  void AddWord(uint64_t word) {
    state_ = (state_ ^ word) * kPrime;
    state_ ^= state_ >> 29;  // the high bits reach the low ones before the next word
    ++words_;
  }
  // Whole 8-byte words, then a trailing partial word zero-padded (the length, mixed in by
  // value(), tells it from a whole one).
  void AddBytes(std::string_view bytes) {
    size_t i = 0;
    for (; i + 8 <= bytes.size(); i += 8) {
      uint64_t word;
      std::memcpy(&word, bytes.data() + i, 8);
      AddWord(word);
    }
    if (i < bytes.size()) {
      uint64_t word = 0;
      std::memcpy(&word, bytes.data() + i, bytes.size() - i);
      AddWord(word);
    }
    tail_bytes_ += bytes.size() % 8;
  }
  uint64_t value() const {
    uint64_t h = state_ ^ (words_ * 8 + tail_bytes_);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
  }

 private:
  static constexpr uint64_t kPrime = 1099511628211ull;  // FNV's 64-bit prime (odd)
  uint64_t state_ = 1469598103934665603ull;
  uint64_t words_ = 0, tail_bytes_ = 0;
};

}  // namespace dcp
