// MessageHash64 (core/message_hash.h) against the damage a checksum of a rank-to-rank message
// must notice: every single-bit flip, the same bit flipped in two consecutive words (which
// word-wise FNV-1a cancelled exactly), zero bytes appended or dropped, and random messages.
// Properties only: no value of the hash is pinned.
#include "core/message_hash.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <unordered_set>

#include "gtest/gtest.h"

namespace dcp {
namespace {

uint64_t HashOf(const std::string& bytes) {
  MessageHash64 hash;
  hash.AddBytes(bytes);
  return hash.value();
}

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string bytes(n, '\0');
  for (char& c : bytes) c = static_cast<char>(rng() & 0xff);
  return bytes;
}

TEST(MessageHashTest, EverySingleBitFlipChangesTheHash) {
  std::mt19937_64 rng(1);
  for (const size_t n : {1u, 7u, 8u, 9u, 64u, 203u}) {
    const std::string message = RandomBytes(rng, n);
    const uint64_t clean = HashOf(message);
    for (size_t bit = 0; bit < 8 * n; ++bit) {
      std::string damaged = message;
      damaged[bit / 8] = static_cast<char>(damaged[bit / 8] ^ (1 << (bit % 8)));
      EXPECT_NE(HashOf(damaged), clean) << "n " << n << " bit " << bit;
    }
  }
}

// Word-wise FNV-1a: bit k of a word reaches only bits >= k of the state, so bit 63 flipped in
// words i and i + 1 cancelled. Every bit position, every pair of consecutive words.
TEST(MessageHashTest, TheSameBitFlippedInConsecutiveWordsChangesTheHash) {
  std::mt19937_64 rng(2);
  const std::string message = RandomBytes(rng, 8 * 16);
  const uint64_t clean = HashOf(message);
  for (size_t word = 0; word + 1 < 16; ++word) {
    for (int bit = 0; bit < 64; ++bit) {
      std::string damaged = message;
      for (const size_t w : {word, word + 1}) {
        const size_t byte = 8 * w + size_t(bit / 8);
        damaged[byte] = static_cast<char>(damaged[byte] ^ (1 << (bit % 8)));
      }
      EXPECT_NE(HashOf(damaged), clean) << "words " << word << ", " << word + 1 << " bit " << bit;
    }
  }
}

TEST(MessageHashTest, ZeroBytesAppendedOrDroppedChangeTheHash) {
  std::mt19937_64 rng(3);
  const std::string message = RandomBytes(rng, 40) + std::string(8, '\0');
  std::unordered_set<uint64_t> seen;
  for (size_t n = 0; n <= message.size(); ++n) {
    EXPECT_TRUE(seen.insert(HashOf(message.substr(0, n))).second) << "prefix of " << n << " bytes";
  }
  EXPECT_TRUE(seen.insert(HashOf(message + std::string(1, '\0'))).second);
  EXPECT_TRUE(seen.insert(HashOf(message + std::string(8, '\0'))).second);
}

TEST(MessageHashTest, WordsAndBytesAgreeAndRandomMessagesDoNotCollide) {
  std::mt19937_64 rng(4);
  std::unordered_set<uint64_t> seen;
  for (int i = 0; i < 100000; ++i) {
    const std::string message = RandomBytes(rng, 32);
    MessageHash64 words;
    for (int w = 0; w < 4; ++w) {
      uint64_t word;
      std::memcpy(&word, message.data() + 8 * w, 8);
      words.AddWord(word);
    }
    ASSERT_EQ(words.value(), HashOf(message));
    EXPECT_TRUE(seen.insert(words.value()).second) << "message " << i;
  }
}

}  // namespace
}  // namespace dcp
