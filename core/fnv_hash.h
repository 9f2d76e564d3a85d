// FNV-1a 64: a hash every process computes alike (absl::Hash is seeded per process), for
// checksums of messages between ranks and for comparing settings across ranks. Words are
// mixed whole (one multiply per 8 bytes).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace dcp {

class Fnv1a64 {
 public:
  void AddWord(uint64_t word) { hash_ = (hash_ ^ word) * 1099511628211ull; }
  // Whole 8-byte words, then a trailing partial word byte by byte.
  void AddWords(std::string_view bytes) {
    size_t i = 0;
    for (; i + 8 <= bytes.size(); i += 8) {
      uint64_t word;
      std::memcpy(&word, bytes.data() + i, 8);
      AddWord(word);
    }
    for (; i < bytes.size(); ++i) AddWord(static_cast<unsigned char>(bytes[i]));
  }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 1469598103934665603ull;
};

}  // namespace dcp
