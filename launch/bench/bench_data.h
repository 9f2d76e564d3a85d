// Generated data and device buffers of the benchmarks. Every value is a pure function of
// (seed, stream, index), so each rank can build its share and predict what a collective must
// deliver, without any exchange (the #wrong checks rely on that).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "launch/batch_spec.h"
#include "runtime/device.h"

namespace dcp::bench {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The values of one (seed, stream): one SplitMix64 per value, so gigabytes are cheap.
class ValueStream {
 public:
  ValueStream(uint64_t seed, uint64_t stream) : key_(SplitMix64(SplitMix64(seed) ^ stream)) {}
  uint64_t Bits(uint64_t index) const { return SplitMix64(key_ ^ (index * 0xd1342543de82ef95ull)); }
  // In [-1, 1): 24 random bits, exact in F32.
  float operator()(uint64_t index) const {
    return static_cast<float>(Bits(index) >> 40) * (2.0f / 16777216.0f) - 1.0f;
  }
  // A multiple of 1/4 in [-31.75, 31.75]: exact in BF16 and F32, for bit-exact copy checks.
  float Exact(uint64_t index) const {
    return static_cast<float>(static_cast<int64_t>(Bits(index) % 255) - 127) * 0.25f;
  }

 private:
  uint64_t key_;
};

inline float Value(uint64_t seed, uint64_t stream, uint64_t index) {
  return ValueStream(seed, stream)(index);
}
inline float ExactValue(uint64_t seed, uint64_t stream, uint64_t index) {
  return ValueStream(seed, stream).Exact(index);
}

// host floats -> a new device buffer holding them in `dtype` (F32 or BF16).
absl::StatusOr<Buffer> UploadAs(Device& device, absl::Span<const float> values, DType dtype);
absl::StatusOr<Buffer> UploadInts(Device& device, absl::Span<const int32_t> values);
// count elements of `dtype` at device pointer `data` -> host floats.
absl::StatusOr<std::vector<float>> DownloadFloats(Device& device, const void* data, DType dtype,
                                                  size_t count);
absl::StatusOr<Buffer> AllocateZeroed(Device& device, size_t bytes);
// Fills count elements of `dtype` at device pointer `data` with Value(seed, stream, i % 2^20)
// * scale: one 2^20-element block is generated on the host, the rest copied on the device
// (benchmark inputs of gigabytes in a fraction of a second; the repetition does not matter
// to a kernel's speed).
absl::Status FillRandom(Device& device, void* data, DType dtype, size_t count, uint64_t seed,
                        uint64_t stream, float scale = 1.0f);

// One batch of a sweep, parsed.
struct BatchShape {
  std::string spec;
  std::vector<launch::RequestShape> requests;
  int64_t num_tokens = 0;  // sum of query_len
  int64_t num_keys = 0;    // sum of seq_len
  int max_seq_len = 0, max_query_len = 0;
  bool has_context = false;  // some request has seq_len > query_len (an extend)

  // Causal keys summed over the query tokens, each token's selection capped at `topk`.
  double SelectedKeys(int topk) const;
};
absl::StatusOr<BatchShape> ParseShape(const std::string& spec);

// Row [topk] of the top-k positions of the token at request-local `position` of a request of
// `seq_len` tokens: every causal position when position < topk, else the token itself and
// topk - 1 earlier positions spread evenly over [0, position) (a deterministic stand-in for
// the indexer: scattered rows, as a real selection reads them). Ascending, -1 padded.
void FillTopkRow(int32_t position, int topk, int32_t* row);

}  // namespace dcp::bench
